//! `--request-timeout`: one deadline over the whole request (pause and sleep holds, the
//! upstream exchange), answered 504. WebSocket upgrades and event streams are exempt: they
//! are meant to stay open.

use http::{HeaderMap, header};
use std::time::Duration;
use tokio::time::Instant;

use crate::proxy::headers::is_websocket;

/// When this request must have its response headers, if it has a deadline at all.
pub fn deadline_for(timeout: Option<Duration>, headers: &HeaderMap) -> Option<Instant> {
    let timeout = timeout?;
    if is_websocket(headers) || accepts_event_stream(headers) {
        return None;
    }
    Some(Instant::now() + timeout)
}

fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn exemptions() {
        let t = Some(Duration::from_secs(1));
        assert!(deadline_for(None, &HeaderMap::new()).is_none());
        assert!(deadline_for(t, &HeaderMap::new()).is_some());
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html, text/event-stream;q=1"),
        );
        assert!(deadline_for(t, &h).is_none());
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(deadline_for(t, &h).is_none());
    }
}
