//! HTTP-01 answers (pipeline step 2): before routing and any redirect. A token pending for
//! this host is answered with its key authorization; any other challenge path for a host
//! whose service gets its certificates over ACME is answered as autocert does (403 for a
//! host the service does not list, 404 for an unknown token). Challenge paths of other
//! services go on to the service like any request.

use http::Request;

use crate::proxy::rejection::Rejection;
use crate::router::Router;
use crate::tls::CertSource;
use crate::tls::challenge::HTTP01_PREFIX;
use crate::uri::{host_without_port, request_host};

/// The answer to a challenge path, or `None` when it goes on to the service.
pub fn answer<B>(router: &Router, req: &Request<B>) -> Option<Rejection> {
    let token = req.uri().path().strip_prefix(HTTP01_PREFIX)?;
    let host = host_without_port(request_host(req).unwrap_or(""));
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if let Some(key_auth) = router.tls().challenges.http01(token, &host) {
        return Some(Rejection::ChallengeAnswered {
            key_authorization: key_auth,
        });
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
        return Some(Rejection::ChallengeHostNotAllowed { host });
    }
    Some(Rejection::ChallengeUnknownToken)
}
