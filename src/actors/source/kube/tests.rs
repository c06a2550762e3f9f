use kube::{Config, Resource, ResourceExt};
use serde_json::Value;

use super::client::set_master;
use super::*;
use crate::config::ClientConnectionConfiguration;
use crate::msgs::source::Change;
use k8s_openapi::api::core::v1::ServiceSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn service(name: &str, version: &str, cluster_ip: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec { cluster_ip: Some(cluster_ip.into()), ..ServiceSpec::default() }),
        ..Service::default()
    }
}

fn node(name: &str, version: Option<&str>) -> Node {
    let metadata =
        ObjectMeta { name: Some(name.into()), resource_version: version.map(Into::into), ..ObjectMeta::default() };
    Node { metadata, ..Node::default() }
}

/// `applied Service default/a@3`, `deleted Node n@1`, `synced Service`.
fn summary(events: &[SourceEvent]) -> Vec<String> {
    fn line<K: Resource>(verb: &str, kind: &str, object: &K) -> String {
        let name = match object.namespace() {
            Some(ns) => format!("{ns}/{}", object.name_any()),
            None => object.name_any(),
        };
        format!("{verb} {kind} {name}@{}", object.resource_version().unwrap_or_default())
    }
    fn change<K: Resource>(kind: &str, change: &Change<K>) -> String {
        match change {
            Change::Applied(o) => line("applied", kind, o.as_ref()),
            Change::Deleted(o) => line("deleted", kind, o.as_ref()),
        }
    }
    (events.iter())
        .map(|event| match event {
            SourceEvent::Service(c) => change("Service", c),
            SourceEvent::EndpointSlice(c) => change("EndpointSlice", c),
            SourceEvent::Node(c) => change("Node", c),
            SourceEvent::ServiceCidr(c) => change("ServiceCIDR", c),
            SourceEvent::Synced(kind) => format!("synced {kind}"),
        })
        .collect()
}

/// Feeds a whole list (`Init`, `InitApply`…, `InitDone`).
fn list<K: Watched>(state: &mut RelistState<K>, objects: Vec<K>) -> Vec<String> {
    let mut events = state.handle(Event::Init);
    for object in objects {
        events.extend(state.handle(Event::InitApply(object)));
    }
    events.extend(state.handle(Event::InitDone));
    summary(&events)
}

fn listed_state(objects: Vec<Service>) -> RelistState<Service> {
    let mut state = RelistState::new();
    list(&mut state, objects);
    state
}

#[test]
fn the_first_list_applies_every_object_then_syncs() {
    let mut state = RelistState::new();
    let events = list(&mut state, vec![service("a", "3", "10.96.0.1"), service("b", "4", "10.96.0.2")]);
    assert_eq!(events, ["applied Service default/a@3", "applied Service default/b@4", "synced Service"]);
    assert!(state.is_synced());
    assert_eq!(state.len(), 2);
}

#[test]
fn an_empty_first_list_only_syncs() {
    let mut state = RelistState::<Node>::new();
    assert_eq!(list(&mut state, vec![]), ["synced Node"]);
    assert!(state.is_empty());
}

#[test]
fn a_relist_emits_nothing_before_init_done() {
    let mut state = listed_state(vec![]);
    assert!(state.handle(Event::Init).is_empty());
    assert!(state.handle(Event::InitApply(service("a", "3", "10.96.0.1"))).is_empty());
    assert!(state.is_empty());
}

/// The first list of `n` Services `s0`…, one event at a time: the number
/// of events each `InitApply` and the `InitDone` returned, where not 0.
fn first_list_batches(state: &mut RelistState<Service>, n: usize) -> Vec<usize> {
    let mut batches = vec![state.handle(Event::Init).len()];
    for i in 0..n {
        batches.push(state.handle(Event::InitApply(service(&format!("s{i}"), "1", "10.96.0.1"))).len());
    }
    batches.push(state.handle(Event::InitDone).len());
    batches.retain(|n| *n > 0);
    batches
}

#[test]
fn the_first_list_is_passed_on_in_chunks_before_it_completes() {
    let mut state = RelistState::new();
    let batches = first_list_batches(&mut state, 2 * FIRST_LIST_CHUNK + 3);
    // Two full chunks as listed; the rest and `Synced` at `InitDone`.
    assert_eq!(batches, [FIRST_LIST_CHUNK, FIRST_LIST_CHUNK, 3 + 1]);
    assert!(state.is_synced());
    assert_eq!(state.len(), 2 * FIRST_LIST_CHUNK + 3);
}

#[test]
fn a_first_list_started_over_deletes_what_its_first_try_passed_on_and_no_longer_lists() {
    let mut state = RelistState::new();
    state.handle(Event::Init);
    let mut passed = Vec::new();
    for i in 0..FIRST_LIST_CHUNK {
        passed.extend(state.handle(Event::InitApply(service(&format!("s{i}"), "1", "10.96.0.1"))));
    }
    assert_eq!(passed.len(), FIRST_LIST_CHUNK);
    // The list failed half-way, and `gone` (listed, not passed on yet) too.
    state.handle(Event::InitApply(service("gone", "2", "10.96.0.2")));
    let held = state.handle(Event::Init);
    assert_eq!(summary(&held), ["applied Service default/gone@2"]);
    // The second try lists all but s0 and gone.
    for i in 1..FIRST_LIST_CHUNK {
        state.handle(Event::InitApply(service(&format!("s{i}"), "1", "10.96.0.1")));
    }
    let done = summary(&state.handle(Event::InitDone));
    let not_applied: Vec<&String> = done.iter().filter(|l| !l.starts_with("applied")).collect();
    assert_eq!(not_applied, ["deleted Service default/gone@2", "deleted Service default/s0@1", "synced Service"]);
    assert_eq!(state.len(), FIRST_LIST_CHUNK - 1);
}

#[test]
fn a_relist_of_the_same_objects_emits_nothing() {
    let objects = vec![service("a", "3", "10.96.0.1"), service("b", "4", "10.96.0.2")];
    let mut state = listed_state(objects.clone());
    assert!(list(&mut state, objects).is_empty());
    assert_eq!(state.len(), 2);
}

#[test]
fn a_relist_emits_exactly_the_deleted_object() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1"), service("b", "4", "10.96.0.2")]);
    assert_eq!(list(&mut state, vec![service("a", "3", "10.96.0.1")]), ["deleted Service default/b@4"]);
    assert_eq!(state.len(), 1);
}

#[test]
fn a_relist_emits_new_and_changed_objects() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1"), service("b", "4", "10.96.0.2")]);
    let relisted = vec![service("a", "7", "10.96.0.9"), service("b", "4", "10.96.0.2"), service("c", "8", "10.96.0.3")];
    assert_eq!(list(&mut state, relisted), ["applied Service default/a@7", "applied Service default/c@8"]);
}

#[test]
fn a_relist_deletes_before_it_applies() {
    let mut state = listed_state(vec![service("b", "4", "10.96.0.2")]);
    let events = list(&mut state, vec![service("a", "9", "10.96.0.2")]);
    assert_eq!(events, ["deleted Service default/b@4", "applied Service default/a@9"]);
}

#[test]
fn a_deleted_object_is_sent_as_its_identity_and_last_version() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1")]);
    let events = state.handle(Event::Init);
    assert!(events.is_empty());
    let events = state.handle(Event::InitDone);
    let [SourceEvent::Service(Change::Deleted(gone))] = &events[..] else {
        panic!("{:?}", summary(&events));
    };
    assert_eq!(gone.metadata.name.as_deref(), Some("a"));
    assert_eq!(gone.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(gone.metadata.resource_version.as_deref(), Some("3"));
    assert_eq!(gone.spec, None, "the spec is not kept: the model had it already");
}

#[test]
fn a_node_is_kept_whole() {
    let node = Arc::new(Node {
        metadata: ObjectMeta { name: Some("n".into()), resource_version: Some("1".into()), ..Default::default() },
        spec: Some(Default::default()),
        ..Default::default()
    });
    assert_eq!(Node::kept(node.clone()), Kept::Whole(node));
}

#[test]
fn an_interrupted_relist_starts_over_at_the_next_init() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1")]);
    state.handle(Event::Init);
    state.handle(Event::InitApply(service("b", "5", "10.96.0.2")));
    // The list failed half-way; the watcher starts again.
    let events = list(&mut state, vec![service("a", "3", "10.96.0.1")]);
    assert!(events.is_empty(), "{events:?}");
}

#[test]
fn watch_events_pass_through() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1")]);
    let events = state.handle(Event::Apply(service("b", "5", "10.96.0.2")));
    assert_eq!(summary(&events), ["applied Service default/b@5"]);
    let events = state.handle(Event::Apply(service("a", "6", "10.96.0.3")));
    assert_eq!(summary(&events), ["applied Service default/a@6"]);
    let events = state.handle(Event::Delete(service("b", "7", "10.96.0.2")));
    assert_eq!(summary(&events), ["deleted Service default/b@7"]);
    assert_eq!(state.len(), 1);
}

#[test]
fn a_repeated_watch_event_is_dropped() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1")]);
    assert!(state.handle(Event::Apply(service("a", "3", "10.96.0.1"))).is_empty());
    assert!(state.handle(Event::Delete(service("z", "9", "10.96.0.9"))).is_empty());
}

#[test]
fn watch_changes_are_the_baseline_of_the_next_relist() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1")]);
    state.handle(Event::Apply(service("a", "6", "10.96.0.3")));
    state.handle(Event::Apply(service("b", "7", "10.96.0.4")));
    let relisted = vec![service("a", "6", "10.96.0.3"), service("b", "7", "10.96.0.4")];
    assert!(list(&mut state, relisted).is_empty());
}

#[test]
fn synced_is_sent_only_after_the_first_list() {
    let mut state = listed_state(vec![]);
    assert!(list(&mut state, vec![]).is_empty());
    let events = list(&mut state, vec![service("a", "3", "10.96.0.1")]);
    assert_eq!(events, ["applied Service default/a@3"]);
}

#[test]
fn objects_without_resource_version_are_compared_whole() {
    let mut state = RelistState::new();
    list(&mut state, vec![node("n", None)]);
    assert!(list(&mut state, vec![node("n", None)]).is_empty());
    let mut labelled = node("n", None);
    labelled.metadata.labels = Some([("zone".to_owned(), "a".to_owned())].into());
    assert_eq!(list(&mut state, vec![labelled]), ["applied Node n@"]);
}

#[test]
fn the_same_name_in_two_namespaces_is_two_objects() {
    let mut other = service("a", "5", "10.96.0.2");
    other.metadata.namespace = Some("other".into());
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1"), other]);
    assert_eq!(state.len(), 2);
    let events = state.handle(Event::Delete(service("a", "6", "10.96.0.1")));
    assert_eq!(summary(&events), ["deleted Service default/a@6"]);
    assert_eq!(state.len(), 1);
}

fn bad_service(name: &str, version: &str) -> Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "resourceVersion": version, "uid": "u-1"},
        "spec": {"clusterIP": "10.96.0.66", "ports": [{"port": 80}, {"port": "abc"}]},
    })
}

fn refused(name: &str, version: &str) -> Item<Service> {
    let item = Item::decode(bad_service(name, version));
    assert!(item.0.is_err(), "{item:?}");
    item
}

/// `list` with items that may be refused.
fn list_items<K: Watched>(state: &mut RelistState<K>, items: Vec<Item<K>>) -> Vec<String> {
    let mut events = state.handle_item(Event::Init);
    for item in items {
        events.extend(state.handle_item(Event::InitApply(item)));
    }
    events.extend(state.handle_item(Event::InitDone));
    summary(&events)
}

#[test]
fn a_refusal_names_the_object_and_the_field() {
    let Item(Err(refused)) = Item::<Service>::decode(bad_service("bad", "7")) else { panic!("decoded") };
    assert_eq!(refused.object(), "default/bad");
    assert_eq!(refused.field, "spec.ports[1].port");
    assert_eq!(refused.error, "invalid type: string \"abc\", expected i32");
    assert_eq!(refused.meta.resource_version.as_deref(), Some("7"));
    assert_eq!(refused.meta.uid.as_deref(), Some("u-1"));
    let Item(Ok(good)) = Item::<Service>::decode(serde_json::to_value(service("a", "3", "10.96.0.1")).unwrap()) else {
        panic!("refused a good Service")
    };
    assert_eq!(good, service("a", "3", "10.96.0.1"));
}

#[test]
fn a_refusal_quotes_at_most_a_bounded_part_of_the_value() {
    let mut value = bad_service("bad", "7");
    value["spec"]["ports"][1]["port"] = Value::String("é".repeat(10_000));
    let Item(Err(refused)) = Item::<Service>::decode(value) else { panic!("decoded") };
    assert!(refused.error.len() <= REFUSAL_DETAIL_MAX + '…'.len_utf8(), "{}", refused.error.len());
    assert!(refused.error.starts_with("invalid type: string \"éé") && refused.error.ends_with('…'));
    let mut value = bad_service("bad", "7");
    value["metadata"]["namespace"] = serde_json::json!(5);
    let Item(Err(refused)) = Item::<Service>::decode(value) else { panic!("decoded") };
    assert_eq!(refused.field, "metadata.namespace");
    assert_eq!(refused.object(), "bad", "an unreadable namespace is left out");
}

#[test]
fn a_list_or_a_watch_event_with_a_bad_object_still_decodes() {
    let list = serde_json::json!({
        "kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"},
        "items": [service("a", "3", "10.96.0.1"), bad_service("bad", "4"), service("b", "5", "10.96.0.2")],
    });
    let list: kube::core::ObjectList<Item<Service>> = serde_json::from_value(list).expect("the list decodes");
    let refused: Vec<bool> = list.items.iter().map(|i| i.0.is_err()).collect();
    assert_eq!(refused, [false, true, false]);
    // The object before the type: serde buffers it first.
    let text = format!(r#"{{"object":{},"type":"MODIFIED"}}"#, bad_service("bad", "6"));
    let event: kube::core::WatchEvent<Item<Service>> = serde_json::from_str(&text).expect("the event decodes");
    let kube::core::WatchEvent::Modified(Item(Err(refused))) = event else { panic!("{event:?}") };
    assert_eq!((refused.object(), refused.field.as_str()), ("default/bad".into(), "spec.ports[1].port"));
}

#[test]
fn a_refused_object_never_known_is_skipped_and_counted() {
    let mut state = RelistState::new();
    let events = list_items(&mut state, vec![service("a", "3", "10.96.0.1").into(), refused("bad", "4")]);
    assert_eq!(events, ["applied Service default/a@3", "synced Service"]);
    let taken: Vec<String> = state.take_refusals().iter().map(Refused::object).collect();
    assert_eq!(taken, ["default/bad"]);
    assert!(state.take_refusals().is_empty(), "taken");
    assert!(state.handle_item(Event::Apply(refused("bad2", "5"))).is_empty());
    assert_eq!(state.take_refusals().len(), 1);
    assert_eq!(state.len(), 1);
}

#[test]
fn a_known_object_turned_bad_keeps_its_last_version_in_a_watch_and_a_relist() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1"), service("b", "4", "10.96.0.2")]);
    assert!(state.handle_item(Event::Apply(refused("a", "6"))).is_empty());
    assert_eq!(state.take_refusals().len(), 1);
    // A relist that still refuses it neither deletes nor re-applies it.
    let events = list_items(&mut state, vec![refused("a", "7"), service("b", "4", "10.96.0.2").into()]);
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(state.take_refusals().len(), 1);
    assert_eq!(state.len(), 2);
    // Fixed: the new version flows.
    let events = state.handle(Event::Apply(service("a", "8", "10.96.0.9")));
    assert_eq!(summary(&events), ["applied Service default/a@8"]);
}

#[test]
fn a_refused_object_is_deleted_by_its_identity() {
    let mut state = listed_state(vec![service("a", "3", "10.96.0.1")]);
    let events = state.handle_item(Event::Delete(refused("a", "9")));
    assert_eq!(summary(&events), ["deleted Service default/a@9"]);
    assert!(state.take_refusals().is_empty(), "a deletion is not refused");
    assert!(state.is_empty());
}

#[test]
fn only_a_404_or_403_list_makes_a_kind_unavailable() {
    let api = |code: u16| {
        kube::Error::Api(kube::core::Status { code, ..kube::core::Status::failure("no", "NotFound") }.boxed())
    };
    assert!(unavailable(&watcher::Error::InitialListFailed(api(404))));
    assert!(unavailable(&watcher::Error::InitialListFailed(api(403))));
    assert!(unavailable(&watcher::Error::WatchStartFailed(api(404))));
    assert!(!unavailable(&watcher::Error::InitialListFailed(api(500))));
    assert!(!unavailable(&watcher::Error::WatchFailed(api(404))), "a watch that ran: the resource is served");
    assert!(!unavailable(&watcher::Error::NoResourceVersion));
}

#[test]
fn an_unavailable_kind_is_retried_minutes_later_and_then_at_the_usual_backoff() {
    let flag = Arc::new(AtomicBool::new(false));
    let mut backoff = KindBackoff { default: DefaultBackoff::default(), unavailable: flag.clone() };
    assert!(backoff.next().is_some_and(|d| d < Duration::from_secs(5)), "the default backoff starts below a second");
    flag.store(true, Ordering::Relaxed);
    assert_eq!(backoff.next(), Some(UNAVAILABLE_RETRY));
    flag.store(false, Ordering::Relaxed);
    backoff.reset();
    assert!(backoff.next().is_some_and(|d| d < Duration::from_secs(5)));
}

#[test]
fn service_cidrs_are_optional_and_kept_as_their_identity() {
    const { assert!(ServiceCIDR::OPTIONAL && !Service::OPTIONAL && !EndpointSlice::OPTIONAL && !Node::OPTIONAL) };
    let mut state = RelistState::<ServiceCIDR>::new();
    let cidr = |version: &str, cidrs: &[&str]| ServiceCIDR {
        metadata: ObjectMeta {
            name: Some("kubernetes".into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::networking::v1::ServiceCIDRSpec {
            cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
        }),
        status: None,
    };
    assert_eq!(
        list(&mut state, vec![cidr("3", &["10.96.0.0/16"])]),
        ["applied ServiceCIDR kubernetes@3", "synced ServiceCIDR"]
    );
    let events = state.handle(Event::Delete(cidr("4", &[])));
    let [SourceEvent::ServiceCidr(Change::Deleted(gone))] = &events[..] else { panic!("{:?}", summary(&events)) };
    assert_eq!((gone.metadata.name.as_deref(), gone.metadata.namespace.as_deref()), (Some("kubernetes"), None));
    // A bad one is refused by name and field.
    let bad = serde_json::json!({"metadata": {"name": "bad", "resourceVersion": "5"}, "spec": {"cidrs": "10.0.0.0/8"}});
    let Item(Err(refused)) = Item::<ServiceCIDR>::decode(bad) else { panic!("decoded") };
    assert_eq!((refused.object(), refused.field.as_str()), ("bad".to_string(), "spec.cidrs"));
}

#[test]
fn master_without_scheme_gets_one() {
    let url = |master, base: &str| {
        let mut config = Config::new(base.parse().expect("base url"));
        set_master(&mut config, master).map(|()| config.cluster_url.to_string()).ok()
    };
    assert_eq!(url("10.0.0.1:6443", "https://x").as_deref(), Some("https://10.0.0.1:6443/"));
    assert_eq!(url("127.0.0.1:8080", "http://x").as_deref(), Some("http://127.0.0.1:8080/"));
    assert_eq!(url("https://api.example:6443", "http://x").as_deref(), Some("https://api.example:6443/"));
    let mut config = Config::new(Default::default());
    assert!(matches!(set_master(&mut config, "http://bad host"), Err(KubeSourceError::Master { .. })));
}

#[tokio::test]
async fn master_alone_needs_no_kubeconfig() {
    let connection = ClientConnectionConfiguration::default();
    let config = client_config(&connection, Some("http://127.0.0.1:8080")).await.expect("config");
    assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:8080/");
}

#[tokio::test]
async fn master_overrides_the_kubeconfig_server() {
    let dir = tempfile::TempDir::new().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, KUBECONFIG).expect("write kubeconfig");
    let connection = ClientConnectionConfiguration { kubeconfig: path.display().to_string(), ..Default::default() };
    let config = client_config(&connection, None).await.expect("config");
    assert_eq!(config.cluster_url.to_string(), "http://10.0.0.1:8080/");
    let config = client_config(&connection, Some("127.0.0.1:9")).await.expect("config");
    assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:9/");
}

#[tokio::test]
async fn a_missing_kubeconfig_is_named_in_the_error() {
    let connection =
        ClientConnectionConfiguration { kubeconfig: "/nonexistent/kubeconfig".into(), ..Default::default() };
    let error = client_config(&connection, None).await.expect_err("no such file");
    assert!(error.to_string().starts_with("kubeconfig /nonexistent/kubeconfig: "), "{error}");
}

const KUBECONFIG: &str = "apiVersion: v1
kind: Config
current-context: test
clusters:
- name: test
  cluster:
    server: http://10.0.0.1:8080
contexts:
- name: test
  context:
    cluster: test
    user: test
users:
- name: test
  user:
    token: secret
";
