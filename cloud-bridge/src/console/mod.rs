//! The fleet console: a page the bridge serves on its HTTP endpoint (`/console`), plain HTML,
//! CSS and JavaScript shipped in the binary (no build step), drawing the fleet view (`/edges`),
//! the fleet's TCO report (`/tco`) and the dead letters (`/dead-letters`), which it also serves
//! as JSON. Read-only. The endpoint binds loopback by default; the page runs no inline script
//! (a `Content-Security-Policy` of `'self'` only) and writes every value edges sent as text.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use futures_util::future::BoxFuture;

use crate::sink::{FleetStore, SinkError};

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// The fleet's TCO report and the dead letters are read again at most this often.
const CACHE: Duration = Duration::from_secs(2);

/// A JSON document read on demand.
pub(crate) type Load = Box<dyn Fn() -> BoxFuture<'static, Result<String, SinkError>> + Send + Sync>;

/// A JSON document and when it was read.
type Cached = Option<(Instant, Arc<String>)>;

/// What the console's JSON endpoints read.
pub(crate) struct Console {
    tco: Load,
    dead: Load,
    last: tokio::sync::Mutex<[Cached; 2]>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

impl Console {
    /// Reads the reports from `sink`, and the dead letters with `dead` (a JSON document
    /// `{"letters": [...], "note": ...}`, `sink::inspect::dead_letters_doc`).
    pub(crate) fn new<S: FleetStore>(sink: Arc<S>, dead: Load) -> Self {
        let tco: Load = Box::new(move || {
            let sink = sink.clone();
            Box::pin(async move {
                let fleet = crate::tco::fleet(&sink.load_reports().await?);
                serde_json::to_string(&fleet).map_err(|e| SinkError::invalid("tco", e))
            })
        });
        Self { tco, dead, last: Default::default() }
    }

    async fn cached(&self, which: usize) -> Result<Arc<String>, SinkError> {
        let mut last = self.last.lock().await;
        if let Some((at, json)) = &last[which]
            && at.elapsed() < CACHE
        {
            return Ok(json.clone());
        }
        let json = Arc::new(if which == 0 { (self.tco)().await? } else { (self.dead)().await? });
        last[which] = Some((Instant::now(), json.clone()));
        Ok(json)
    }
}

/// The console's routes.
pub(crate) fn routes(console: Arc<Console>) -> axum::Router {
    axum::Router::new()
        .route("/", axum::routing::get(|| async { Redirect::temporary("/console") }))
        .route("/console", axum::routing::get(|| async { asset("text/html; charset=utf-8", PAGE) }))
        .route("/console/console.js", axum::routing::get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/console/console.css", axum::routing::get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/tco", axum::routing::get(tco))
        .route("/dead-letters", axum::routing::get(dead_letters))
        .with_state(console)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, "default-src 'self'; frame-ancestors 'none'; base-uri 'none'"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn json_or_error(read: Result<Arc<String>, SinkError>, what: &str) -> Response {
    match read {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json.as_str().to_owned()).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{what} cannot be read: {e}\n")).into_response(),
    }
}

async fn tco(State(c): State<Arc<Console>>) -> Response {
    json_or_error(c.cached(0).await, "the TCO report")
}

async fn dead_letters(State(c): State<Arc<Console>>) -> Response {
    json_or_error(c.cached(1).await, "the dead letters")
}
