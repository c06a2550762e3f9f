//! The API client as upstream's `createClient` builds it: the in-cluster
//! configuration, or the kubeconfig with `--master` replacing its URL.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tracing::{debug, info};

use super::KubeSourceError;
use crate::config::ClientConnectionConfiguration;

/// The client configuration upstream's `createClient` would build from
/// `clientConnection` and `--master` (`master`: empty or `None` when unset).
pub async fn client_config(
    connection: &ClientConnectionConfiguration,
    master: Option<&str>,
) -> Result<Config, KubeSourceError> {
    let master = master.filter(|m| !m.is_empty());
    let kubeconfig = connection.kubeconfig.as_str();
    let mut config = match kubeconfig {
        "" if master.is_none() => {
            info!("neither kubeconfig file nor master URL was specified, falling back to in-cluster config");
            Config::incluster().map_err(KubeSourceError::InCluster)?
        }
        "" => Config::new(Default::default()),
        path => load_kubeconfig(path).await?,
    };
    if let Some(master) = master {
        set_master(&mut config, master)?;
    }
    log_unsupported_settings(connection);
    Ok(config)
}

/// A client for `config`.
pub fn client(config: Config) -> Result<Client, KubeSourceError> {
    let url = config.cluster_url.to_string();
    Client::try_from(config).map_err(|source| KubeSourceError::Client { url, source })
}

async fn load_kubeconfig(path: &str) -> Result<Config, KubeSourceError> {
    let error = |source| KubeSourceError::Kubeconfig { path: path.to_owned(), source };
    let kubeconfig = Kubeconfig::read_from(path).map_err(error)?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.map_err(error)
}

/// Points `config` at `--master`. Without a scheme: `https` if the
/// kubeconfig configures TLS, `http` otherwise (as client-go's `DefaultServerURL`).
pub(super) fn set_master(config: &mut Config, master: &str) -> Result<(), KubeSourceError> {
    let url = match (master.contains("://"), uses_tls(config)) {
        (true, _) => master.to_owned(),
        (false, true) => format!("https://{master}"),
        (false, false) => format!("http://{master}"),
    };
    config.cluster_url =
        url.parse().map_err(|source| KubeSourceError::Master { url: master.to_owned(), source: Box::new(source) })?;
    Ok(())
}

fn uses_tls(config: &Config) -> bool {
    config.root_cert.is_some() || config.accept_invalid_certs || config.cluster_url.scheme_str() == Some("https")
}

fn log_unsupported_settings(connection: &ClientConnectionConfiguration) {
    debug!(
        qps = connection.qps,
        burst = connection.burst,
        content_type = %connection.content_type,
        accept_content_types = %connection.accept_content_types,
        "clientConnection rate limits and content types are not applied: kube-rs has no client-side \
         rate limiter and speaks JSON only"
    );
}
