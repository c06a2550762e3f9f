//! A route table: exact paths (as Go's `ServeMux` patterns without a
//! trailing slash), an optional fallback for everything else (e.g. a
//! dashboard's own paths), and Go's 404 otherwise. Methods are not checked,
//! as upstream's handlers don't.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::StatusCode;

/// A response body: the whole of it, in memory.
pub type Body = Full<Bytes>;
/// A request as hyper hands it over.
pub type Request = hyper::Request<hyper::body::Incoming>;
/// A response.
pub type Response = hyper::Response<Body>;
/// An asynchronous request handler.
pub type Handler = Arc<dyn Fn(Request) -> BoxFuture<'static, Response> + Send + Sync>;

/// Paths to handlers.
#[derive(Clone, Default)]
pub struct Routes {
    exact: BTreeMap<String, Handler>,
    fallback: Option<Handler>,
}

impl Routes {
    pub fn new() -> Routes {
        Routes::default()
    }

    /// Serves `path` with a synchronous handler (it sees the request head).
    pub fn route<F>(self, path: &str, f: F) -> Routes
    where
        F: Fn(&Request) -> Response + Send + Sync + 'static,
    {
        self.route_async(path, move |req| std::future::ready(f(&req)))
    }

    /// Serves `path` with an asynchronous handler (it may read the body or
    /// ask an actor).
    pub fn route_async<F, Fut>(mut self, path: &str, f: F) -> Routes
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        self.exact.insert(path.to_string(), boxed(f));
        self
    }

    /// Serves every path no route matches (instead of a 404).
    pub fn fallback<F, Fut>(mut self, f: F) -> Routes
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        self.fallback = Some(boxed(f));
        self
    }

    /// Adds `other`'s routes (and fallback, if any); `other` wins on a clash.
    pub fn merge(mut self, other: Routes) -> Routes {
        self.exact.extend(other.exact);
        self.fallback = other.fallback.or(self.fallback);
        self
    }

    /// The exact paths served, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.exact.keys().map(String::as_str)
    }

    /// Runs the handler for the request's path.
    pub fn dispatch(&self, req: Request) -> BoxFuture<'static, Response> {
        match self.exact.get(req.uri().path()).or(self.fallback.as_ref()) {
            Some(handler) => handler(req),
            None => std::future::ready(not_found()).boxed(),
        }
    }
}

fn boxed<F, Fut>(f: F) -> Handler
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    Arc::new(move |req| f(req).boxed())
}

/// A response with `Content-Type` and, as every upstream handler sets it,
/// `X-Content-Type-Options: nosniff`.
pub fn text_response(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Response {
    let mut resp = hyper::Response::new(Full::new(body.into()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    resp
}

/// Go's `http.NotFound`.
pub fn not_found() -> Response {
    text_response(404, "text/plain; charset=utf-8", "404 page not found\n")
}
