//! HTTP-01 answers (pipeline step 2): before routing, logging and any redirect. A token
//! pending for this host is answered with its key authorization; any other challenge
//! path for a host whose service gets its certificates over ACME is answered as autocert
//! does (403 for a host the service does not list, 404 for an unknown token). Challenge
//! paths of other services go on to the service like any request.

use http::{HeaderValue, Request, Response, StatusCode, header};

use crate::proxy::body::ResponseBody;
use crate::router::Router;
use crate::tls::CertSource;
use crate::tls::challenge::HTTP01_PREFIX;
use crate::uri::{host_without_port, request_host};

pub fn answer<B>(router: &Router, req: &Request<B>) -> Option<Response<ResponseBody>> {
    let token = req.uri().path().strip_prefix(HTTP01_PREFIX)?;
    let host = host_without_port(request_host(req).unwrap_or(""));
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if let Some(key_auth) = router.tls().challenges.http01(token, &host) {
        return Some(text(StatusCode::OK, key_auth));
    }
    let (service, _) = router.lookup(&host, "/")?;
    let config = service.config();
    let Some(CertSource::Acme {
        hosts, on_demand, ..
    }) = config.tls.as_deref()
    else {
        return None;
    };
    if on_demand.is_none() && !hosts.contains(&host) {
        return Some(text(
            StatusCode::FORBIDDEN,
            format!("acme/autocert: host {host:?} not configured in HostWhitelist\n"),
        ));
    }
    Some(text(
        StatusCode::NOT_FOUND,
        "acme/autocert: certificate cache miss\n".into(),
    ))
}

fn text(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(bytes::Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
