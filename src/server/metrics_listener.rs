//! The Prometheus endpoint (`run --metrics-port`): every path answers with the metrics
//! text, as upstream, under the same listener timeouts as the proxy's ports (fork F27).
//! `--metrics-allow-ip` (fork F2) admits only listed connecting addresses; the others get
//! Go's plain-text 403. The address is the socket's own: no forwarded header and no PROXY
//! protocol counts here, as the fork.

use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::h1_timeouts::{Noted, Phase, ResponseOver, Watchdog};
use super::idle::Counted;
use super::limits::Timeouts;
use super::{AcceptBackoff, normalize};
use crate::proxy::body::ResponseBody;
use crate::proxy::rejection::Rejection;
use crate::service::gates::client_ip::IpList;

pub async fn serve(
    listener: TcpListener,
    allowed: Arc<IpList>,
    timeouts: Timeouts,
    stop: CancellationToken,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    // Our own watchdog keeps the header, idle and write timeouts apart.
    http1.timer(hyper_util::rt::TokioTimer::new());
    http1.header_read_timeout(None);
    let mut backoff = AcceptBackoff::default();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff.reset();
                a
            }
            Err(e) => {
                // A full descriptor table: pause instead of spinning, as the other listeners.
                let (pause, log) = backoff.failed();
                if let Some(failures) = log {
                    tracing::error!(error = %e, failures, "Failed to accept metrics connection");
                }
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let admitted = allowed.is_empty() || allowed.contains(normalize(peer).ip());
        let http1 = http1.clone();
        tokio::spawn(async move {
            let phase = Arc::new(Phase::default());
            let noted = phase.clone();
            let service = service_fn(move |_req: Request<Incoming>| {
                noted.request();
                let over = ResponseOver::new(&noted);
                let response = if admitted {
                    metrics()
                } else {
                    Rejection::MetricsForbidden.render(None, &Method::GET)
                };
                std::future::ready(Ok::<_, Infallible>(
                    response.map(|body| Counted::new(body, over)),
                ))
            });
            let io = TokioIo::new(Noted::new(stream, phase.clone()));
            let connection = http1.serve_connection(io, service);
            tokio::select! {
                biased;
                _ = connection => {}
                expired = Watchdog::new(phase, &timeouts) => {
                    tracing::debug!(client = %peer, reason = expired.reason(), "Closing metrics connection");
                }
            }
        });
    }
}

fn metrics() -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(crate::observe::metrics::render()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
