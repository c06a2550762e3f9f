//! `deploy/`: every manifest is a typed Kubernetes object with no unknown
//! field, and the pieces fit together: the DaemonSet runs the binary the
//! Dockerfile installs, with the ConfigMap's configuration (which the
//! daemon's own loader accepts, from the DaemonSet's own command line), as
//! a ServiceAccount whose ClusterRole grants exactly what the daemon reads.
//!
//! k8s-openapi's types ignore unknown fields, so each document is
//! deserialized, serialized back and compared with the original: a key that
//! did not survive the round trip is a field the type does not have (a typo
//! the API server would drop or, with strict validation, refuse).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Probe, ServiceAccount, Volume};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::Resource;
use kube::config::Kubeconfig;
use kube_proxy_rs::config::{self, Flags, ProxyMode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const NAMESPACE: &str = "kube-system";
/// Upstream's healthz port, where the probes go.
const HEALTHZ_PORT: u16 = 10256;
/// The node name the test substitutes for `$(NODE_NAME)`.
const NODE: &str = "node-a";
/// Where the kubelet mounts the pod's service account token and CA.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// The Kubernetes manifests: `deploy/*.yaml` except kustomization.yaml.
fn manifest_files() -> Vec<PathBuf> {
    let entries = std::fs::read_dir(deploy_dir()).expect("reading deploy/");
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("reading deploy/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in deploy/");
    files
}

fn file_name(path: &Path) -> String {
    path.file_name().expect("file name").to_string_lossy().into_owned()
}

/// Each non-empty YAML document of `text`, as JSON.
fn documents(text: &str, origin: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let yaml = yaml_serde::Value::deserialize(document).unwrap_or_else(|e| panic!("{origin} document {i}: {e}"));
        if yaml.is_null() {
            continue;
        }
        out.push(serde_json::to_value(&yaml).unwrap_or_else(|e| panic!("{origin} document {i}: {e}")));
    }
    out
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// What changed between a document and its typed round trip, each naming
/// its path (`spec.template.spec.containers[0].name`): keys the type
/// dropped (unknown fields), values it read differently, keys it added.
fn round_trip_differences(original: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                match b.get(key) {
                    Some(other) => round_trip_differences(value, other, &child(path, key), out),
                    None if value.is_null() => out.push(format!("{}: null (drop it)", child(path, key))),
                    None => out.push(format!("{}: unknown field", child(path, key))),
                }
            }
            for key in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{}: added by the round trip", child(path, key)));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                round_trip_differences(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ if original == back => {}
        _ => out.push(format!("{path}: {original} reads back as {back}")),
    }
}

/// `document` as a `T`, or every reason it isn't one exactly.
fn typed<T: DeserializeOwned + Serialize>(document: &Value) -> Result<T, Vec<String>> {
    let object: T = serde_json::from_value(document.clone()).map_err(|e| vec![e.to_string()])?;
    let back = serde_json::to_value(&object).map_err(|e| vec![e.to_string()])?;
    let mut differences = Vec::new();
    round_trip_differences(document, &back, "", &mut differences);
    if differences.is_empty() {
        Ok(object)
    } else {
        Err(differences)
    }
}

/// The objects under deploy/, by kind.
#[derive(Default)]
struct Deploy {
    daemon_sets: Vec<DaemonSet>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
}

fn is<T: Resource>(api_version: &str, kind: &str) -> bool {
    api_version == T::API_VERSION && kind == T::KIND
}

fn push<T: DeserializeOwned + Serialize>(into: &mut Vec<T>, document: &Value, origin: &str, errors: &mut Vec<String>) {
    match typed(document) {
        Ok(object) => into.push(object),
        Err(why) => errors.extend(why.into_iter().map(|w| format!("{origin}: {w}"))),
    }
}

impl Deploy {
    /// Reads every manifest; panics listing every problem found.
    fn load() -> Deploy {
        let mut deploy = Deploy::default();
        let mut errors = Vec::new();
        for path in manifest_files() {
            let text = std::fs::read_to_string(&path).expect("reading a manifest");
            for (i, document) in documents(&text, &file_name(&path)).iter().enumerate() {
                let field = |name: &str| document.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
                let (api_version, kind) = (field("apiVersion"), field("kind"));
                let origin = format!("{} document {i} ({kind} {})", file_name(&path), document["metadata"]["name"]);
                deploy.add(document, &api_version, &kind, &origin, &mut errors);
            }
        }
        assert!(errors.is_empty(), "deploy/ manifests:\n  {}", errors.join("\n  "));
        deploy
    }

    fn add(&mut self, document: &Value, api_version: &str, kind: &str, origin: &str, errors: &mut Vec<String>) {
        if is::<DaemonSet>(api_version, kind) {
            push(&mut self.daemon_sets, document, origin, errors);
        } else if is::<ServiceAccount>(api_version, kind) {
            push(&mut self.service_accounts, document, origin, errors);
        } else if is::<ClusterRole>(api_version, kind) {
            push(&mut self.cluster_roles, document, origin, errors);
        } else if is::<ClusterRoleBinding>(api_version, kind) {
            push(&mut self.bindings, document, origin, errors);
        } else if is::<ConfigMap>(api_version, kind) {
            push(&mut self.config_maps, document, origin, errors);
        } else {
            errors.push(format!("{origin}: unexpected apiVersion {api_version:?} kind {kind:?}"));
        }
    }

    fn daemon_set(&self) -> &DaemonSet {
        only(&self.daemon_sets, "DaemonSet")
    }

    fn pod(&self) -> &PodSpec {
        let template = &self.daemon_set().spec.as_ref().expect("DaemonSet spec").template;
        template.spec.as_ref().expect("pod spec")
    }

    fn container(&self) -> &Container {
        let containers = &self.pod().containers;
        assert_eq!(containers.len(), 1, "one container");
        &containers[0]
    }

    fn config_map(&self) -> &ConfigMap {
        only(&self.config_maps, "ConfigMap")
    }

    fn config_map_data(&self) -> &BTreeMap<String, String> {
        self.config_map().data.as_ref().expect("ConfigMap data")
    }

    fn service_account(&self) -> &ServiceAccount {
        only(&self.service_accounts, "ServiceAccount")
    }

    /// The pod's volume named `name`.
    fn volume(&self, name: &str) -> &Volume {
        let volumes = self.pod().volumes.as_deref().unwrap_or_default();
        volumes.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no volume {name:?}"))
    }

    /// Where the ConfigMap is mounted in the container.
    fn config_mount_path(&self) -> String {
        let name = self.config_map().metadata.name.as_deref().expect("ConfigMap name");
        let volume = (self.pod().volumes.as_deref().unwrap_or_default().iter())
            .find(|v| v.config_map.as_ref().is_some_and(|c| c.name == name))
            .expect("a volume of the ConfigMap");
        let mounts = self.container().volume_mounts.as_deref().unwrap_or_default();
        let mount = mounts.iter().find(|m| m.name == volume.name).expect("the ConfigMap volume is mounted");
        assert_eq!(mount.read_only, Some(true), "the ConfigMap is mounted read-only");
        mount.mount_path.clone()
    }

    /// The container's command line as the kubelet runs it: command then
    /// args, `$(VAR)` expanded from the container's env (spec.nodeName = [`NODE`]).
    fn command_line(&self) -> Vec<String> {
        let container = self.container();
        let mut vars = BTreeMap::new();
        for env in container.env.as_deref().unwrap_or_default() {
            let field = env.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
            let value = match field {
                Some("spec.nodeName") => NODE.to_string(),
                Some(other) => panic!("env {}: unexpected fieldRef {other}", env.name),
                None => env.value.clone().unwrap_or_default(),
            };
            vars.insert(format!("$({})", env.name), value);
        }
        let words = container.command.iter().chain(&container.args).flatten();
        words.map(|word| vars.iter().fold(word.clone(), |w, (var, value)| w.replace(var, value))).collect()
    }
}

fn only<'a, T>(items: &'a [T], kind: &str) -> &'a T {
    assert_eq!(items.len(), 1, "deploy/ holds exactly one {kind}");
    &items[0]
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.namespace.as_deref()
}

#[test]
fn every_manifest_is_a_known_kind_with_no_unknown_field() {
    let deploy = Deploy::load();
    assert_eq!(namespace_of(&deploy.daemon_set().metadata), Some(NAMESPACE));
    assert_eq!(namespace_of(&deploy.config_map().metadata), Some(NAMESPACE));
    assert_eq!(namespace_of(&deploy.service_account().metadata), Some(NAMESPACE));
    only(&deploy.cluster_roles, "ClusterRole");
    only(&deploy.bindings, "ClusterRoleBinding");
}

#[test]
fn unknown_fields_and_changed_values_are_reported_with_their_path() {
    let mut differences = Vec::new();
    let (original, back) = (serde_json::json!({"a": [{"b": 1}]}), serde_json::json!({"a": [{"b": "1"}], "c": 2}));
    round_trip_differences(&original, &back, "", &mut differences);
    assert_eq!(differences, [r#"a[0].b: 1 reads back as "1""#, "c: added by the round trip"]);

    let text = std::fs::read_to_string(deploy_dir().join("daemonset.yaml")).expect("daemonset.yaml");
    let mut document = documents(&text, "daemonset.yaml").remove(0);
    assert!(typed::<DaemonSet>(&document).is_ok());
    let pod = &mut document["spec"]["template"]["spec"];
    pod["hostNetwrok"] = Value::Bool(true);
    pod["containers"][0]["volumeMounts"][1]["readonly"] = Value::Bool(true);
    let errors = typed::<DaemonSet>(&document).expect_err("typos are found");
    assert_eq!(
        errors,
        [
            "spec.template.spec.containers[0].volumeMounts[1].readonly: unknown field",
            "spec.template.spec.hostNetwrok: unknown field",
        ]
    );
    // A wrong type is the deserializer's error.
    document["spec"]["template"]["spec"]["hostNetwork"] = Value::String("yes".into());
    let errors = typed::<DaemonSet>(&document).expect_err("wrong type");
    assert!(errors[0].contains("invalid type"), "{errors:?}");
}

#[test]
fn daemon_set_runs_on_every_node_in_the_host_network() {
    let deploy = Deploy::load();
    let ds = deploy.daemon_set();
    let spec = ds.spec.as_ref().expect("spec");
    let pod = deploy.pod();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    let tolerations = pod.tolerations.as_deref().unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()),
        "a toleration of every taint (operator Exists, no key, no effect): {tolerations:?}"
    );
    let selector: BTreeMap<&str, &str> =
        pod.node_selector.iter().flatten().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(selector, BTreeMap::from([("kubernetes.io/os", "linux")]), "no node left out but non-Linux ones");

    let wanted = spec.selector.match_labels.as_ref().expect("matchLabels");
    let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref()).expect("pod labels");
    assert!(wanted.iter().all(|(k, v)| labels.get(k) == Some(v)), "the selector matches the pod's labels");

    let strategy = spec.update_strategy.as_ref().expect("updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().expect("rollingUpdate");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(1)));

    let account = deploy.service_account().metadata.name.as_deref();
    assert_eq!(pod.service_account_name.as_deref(), account);

    let container = deploy.container();
    let security = container.security_context.as_ref().expect("securityContext");
    assert_eq!(security.privileged, Some(true));
    let requests = container.resources.as_ref().and_then(|r| r.requests.as_ref()).expect("resource requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"), "{requests:?}");
    let command = deploy.command_line();
    assert_eq!(command.first().map(String::as_str), Some("/usr/local/bin/kube-proxy-rs"));
    assert!(command.contains(&format!("--hostname-override={NODE}")), "{command:?}");
}

#[test]
fn daemon_set_mounts_the_config_the_xtables_lock_and_modules() {
    let deploy = Deploy::load();
    let mount = deploy.config_mount_path();
    let command = deploy.command_line();
    assert_eq!(command.iter().filter(|a| a.starts_with("--config")).count(), 1, "{command:?}");
    let config = command.iter().find_map(|a| a.strip_prefix("--config=")).expect("--config=FILE");
    let key = config.strip_prefix(&format!("{mount}/")).expect("--config names a file in the ConfigMap's mount");
    assert!(deploy.config_map_data().contains_key(key), "--config={config}: no key {key:?} in the ConfigMap");

    let mounts = deploy.container().volume_mounts.as_deref().unwrap_or_default();
    for (path, read_only, host_type) in
        [("/run/xtables.lock", false, Some("FileOrCreate")), ("/lib/modules", true, None)]
    {
        let m = mounts.iter().find(|m| m.mount_path == path).unwrap_or_else(|| panic!("no mount at {path}"));
        assert_eq!(m.read_only.unwrap_or(false), read_only, "{path} readOnly");
        let host = deploy.volume(&m.name).host_path.as_ref().unwrap_or_else(|| panic!("{path}: not a hostPath"));
        assert_eq!((host.path.as_str(), host.type_.as_deref()), (path, host_type), "{path} hostPath");
    }
}

fn http_get(probe: Option<&Probe>, which: &str) -> (String, IntOrString) {
    let get = probe.and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("no {which} httpGet"));
    assert!(get.host.is_none(), "{which}: the pod's (so the node's) address");
    (get.path.clone().unwrap_or_default(), get.port.clone())
}

#[test]
fn probes_reach_the_configured_health_server() {
    let deploy = Deploy::load();
    let container = deploy.container();
    let port = IntOrString::Int(HEALTHZ_PORT.into());
    assert_eq!(http_get(container.liveness_probe.as_ref(), "livenessProbe"), ("/livez".into(), port.clone()));
    assert_eq!(http_get(container.readiness_probe.as_ref(), "readinessProbe"), ("/healthz".into(), port));

    // The health server listens there on every address, the node's included.
    let text = &deploy.config_map_data()["config.conf"];
    let mut cfg = config::parse_str(text, "config.conf").expect("config.conf");
    cfg.set_defaults();
    let healthz = cfg.healthz_addr().expect("a healthz address");
    assert_eq!(healthz.port(), HEALTHZ_PORT);
    assert!(healthz.ip().is_unspecified(), "healthzBindAddress {healthz}: the probes reach the node's address");
}

#[test]
fn config_map_config_is_accepted_by_the_daemons_loader() {
    let deploy = Deploy::load();
    let data = deploy.config_map_data();
    let text = data.get("config.conf").expect("config.conf in the ConfigMap");

    // As the daemon reads it: strict parse, defaults, validation.
    let mut cfg = config::parse_str(text, "config.conf").unwrap_or_else(|e| panic!("{e}"));
    cfg.set_defaults();
    cfg.apply_platform_defaults();
    config::validate(&cfg).unwrap_or_else(|e| panic!("{e}"));

    // And from the DaemonSet's own command line, the ConfigMap's files
    // standing in a directory for its mount.
    let dir = tempfile::tempdir().expect("tempdir");
    for (key, value) in data {
        std::fs::write(dir.path().join(key), value).expect("writing a ConfigMap key");
    }
    let mount = deploy.config_mount_path();
    let local = dir.path().display().to_string();
    let args: Vec<String> = deploy.command_line().iter().map(|a| a.replace(&mount, &local)).collect();
    let flags = Flags::try_parse_args(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let cfg = config::load(&flags).unwrap_or_else(|e| panic!("{args:?}: {e}"));

    assert_eq!(cfg.proxy_mode(), ProxyMode::Iptables);
    assert_eq!(cfg.hostname().expect("node name"), NODE);
    assert_eq!(cfg.ipvs_scheduler(), "rr");
    assert_eq!(cfg.sync_period(), std::time::Duration::from_secs(30));
    assert_eq!(cfg.metrics_addr().map(|a| a.to_string()).as_deref(), Some("127.0.0.1:10249"));
    assert!(!cfg.cluster_cidrs().is_empty(), "clusterCIDR set");

    // The kubeconfig it names is the ConfigMap's other key.
    let kubeconfig = cfg.client_connection.kubeconfig.as_str();
    let key = kubeconfig.strip_prefix(&format!("{mount}/")).expect("clientConnection.kubeconfig in the mount");
    assert!(data.contains_key(key), "clientConnection.kubeconfig {kubeconfig}: no key {key:?} in the ConfigMap");
}

/// The mode is written out, as kubeadm's default (iptables), so that an
/// operator sees what to compare with the kube-proxy ConfigMap; the comment
/// above it names every mode and what each needs.
#[test]
fn config_map_mode_is_kubeadms_default_written_out_with_the_choice_explained() {
    let deploy = Deploy::load();
    let text = deploy.config_map_data().get("config.conf").expect("config.conf in the ConfigMap");
    let doc: Value = yaml_serde::from_str(text).unwrap_or_else(|e| panic!("config.conf: {e}"));
    assert_eq!(doc.get("mode").and_then(Value::as_str), Some("iptables"), "config.conf's mode");

    let before_mode = text.split_once("\nmode:").expect("a top-level mode line").0;
    let comment: String =
        (before_mode.lines().rev()).take_while(|l| l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    for needle in ["kubeadm", "- iptables:", "- nftables:", "- ipvs:", "deprecated", "5.13", "ip_vs"] {
        assert!(comment.contains(needle), "no {needle:?} in the comment above mode:\n{comment}");
    }
}

#[test]
fn kubeconfig_reaches_the_api_server_directly_as_the_pods_service_account() {
    let deploy = Deploy::load();
    let text = deploy.config_map_data().get("kubeconfig.conf").expect("kubeconfig.conf in the ConfigMap");
    let kubeconfig = Kubeconfig::from_yaml(text).unwrap_or_else(|e| panic!("kubeconfig.conf: {e}"));
    assert!(kubeconfig.other.is_empty(), "unknown fields: {:?}", kubeconfig.other.keys());

    let current = kubeconfig.current_context.as_deref().expect("current-context");
    let context = (kubeconfig.contexts.iter().find(|c| c.name == current))
        .and_then(|c| c.context.as_ref())
        .expect("the current context");
    let cluster = (kubeconfig.clusters.iter().find(|c| c.name == context.cluster))
        .and_then(|c| c.cluster.as_ref())
        .expect("the context's cluster");
    let user = (kubeconfig.auth_infos.iter().find(|u| Some(&u.name) == context.user.as_ref()))
        .and_then(|u| u.auth_info.as_ref())
        .expect("the context's user");

    let server = cluster.server.as_deref().expect("server");
    let host = server.strip_prefix("https://").expect("an https server");
    assert!(!host.is_empty() && !host.contains('/'), "server {server}: https://HOST[:PORT]");
    assert_eq!(cluster.certificate_authority.as_deref(), Some(format!("{SERVICE_ACCOUNT_DIR}/ca.crt").as_str()));
    assert_eq!(user.token_file.as_deref(), Some(format!("{SERVICE_ACCOUNT_DIR}/token").as_str()));
}

#[test]
fn cluster_role_grants_exactly_what_the_daemon_reads() {
    let deploy = Deploy::load();
    let role = only(&deploy.cluster_roles, "ClusterRole");
    let mut granted = BTreeSet::new();
    for rule in role.rules.as_deref().unwrap_or_default() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none(), "{rule:?}");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    granted.insert((group.as_str(), resource.as_str(), verb.as_str()));
                }
            }
        }
    }
    let expected = BTreeSet::from([
        ("", "services", "list"),
        ("", "services", "watch"),
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        // wait_for_node reads the Node by name before watching it.
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("networking.k8s.io", "servicecidrs", "list"),
        ("networking.k8s.io", "servicecidrs", "watch"),
    ]);
    assert_eq!(granted, expected);

    let binding = only(&deploy.bindings, "ClusterRoleBinding");
    assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(binding.role_ref.name.as_str()), role.metadata.name.as_deref());
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    let account = &deploy.service_account().metadata;
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(subjects[0].name.as_str()), account.name.as_deref());
    assert_eq!(subjects[0].namespace.as_deref(), account.namespace.as_deref());
}

/// The kustomization.yaml fields used here; any other is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<KustomizeImage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KustomizeImage {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

#[test]
fn kustomization_lists_every_manifest_and_sets_the_image() {
    let text = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).expect("kustomization.yaml");
    let kustomization: Kustomization = yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(kustomization.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(kustomization.kind, "Kustomization");
    let listed: BTreeSet<String> = kustomization.resources.iter().cloned().collect();
    let present: BTreeSet<String> = manifest_files().iter().map(|p| file_name(p)).collect();
    assert_eq!(listed, present, "kustomization.yaml resources are deploy/'s manifests");
    assert_eq!(listed.len(), kustomization.resources.len(), "no manifest listed twice");

    let deploy = Deploy::load();
    let image = deploy.container().image.as_deref().expect("image");
    let name = image.rsplit_once(':').map_or(image, |(name, _tag)| name);
    let entry = kustomization.images.iter().find(|i| i.name == name).expect("an images entry for the image");
    assert!(entry.new_name.is_some() || entry.new_tag.is_some(), "the images entry replaces {image}");
}

#[test]
fn dockerfile_installs_the_binary_the_daemon_set_runs() {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    // Instructions, continuation lines joined.
    let joined = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    let instructions: Vec<String> = joined.replace("\\\n", " ").lines().map(str::to_string).collect();
    let find = |prefix: &str| instructions.iter().filter(|i| i.starts_with(prefix)).cloned().collect::<Vec<_>>();

    assert_eq!(find("FROM "), ["FROM rust:1-bookworm AS builder", "FROM debian:bookworm-slim"]);
    assert!(find("RUN ").iter().any(|r| r.contains("cargo build --release --locked")), "{instructions:#?}");
    let binary = Deploy::load().command_line()[0].clone();
    assert_eq!(find("ENTRYPOINT "), [format!("ENTRYPOINT [\"{binary}\"]")]);
    assert!(find("COPY --from=builder ").iter().any(|c| c.ends_with(&format!(" {binary}"))), "{binary} installed");
    // One list of packages and one finishing script, shared with
    // deploy/image/build.sh (tests/image.rs checks the image it builds).
    let installs = find("RUN apt-get").concat();
    assert!(
        installs.contains("apt-get install -y --no-install-recommends $(sed 's/#.*//' /tmp/image/packages)"),
        "{installs}"
    );
    assert!(installs.contains("sh /tmp/image/setup.sh"), "{installs}");
    assert!(find("COPY ").contains(&"COPY deploy/image/packages deploy/image/setup.sh /tmp/image/".to_string()));
    let setup = std::fs::read_to_string(deploy_dir().join("image/setup.sh")).expect("setup.sh");
    let wrapper = "/usr/sbin/iptables-wrapper";
    assert!(
        find("COPY ").contains(&format!("COPY deploy/iptables-wrapper {wrapper}")),
        "the wrapper where setup.sh wants it"
    );
    assert!(setup.contains(&format!("chmod 0755 {wrapper}")), "setup.sh installs {wrapper}");
    let packages = std::fs::read_to_string(deploy_dir().join("image/packages")).expect("packages");
    let listed: Vec<&str> =
        packages.lines().filter_map(|l| l.split('#').next()).map(str::trim).filter(|p| !p.is_empty()).collect();
    for package in ["ca-certificates", "conntrack", "ipset", "iptables", "kmod"] {
        assert!(listed.contains(&package), "{package} listed in deploy/image/packages");
    }
    assert!(
        find("LABEL ").concat().contains("org.opencontainers.image.revision=$REVISION"),
        "labelled with the commit"
    );
    // Files copied from the build context exist (the context is the repository root).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for copy in find("COPY ").iter().filter(|c| !c.contains("--from=")) {
        let words: Vec<&str> = copy.split_whitespace().collect();
        for source in &words[1..words.len() - 1] {
            assert!(root.join(source).exists(), "{copy}: {source} missing");
        }
    }
}
