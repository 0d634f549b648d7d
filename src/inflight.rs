//! The in-flight guard: held by a request from its admission until its response is over,
//! it tells whoever admitted the request when that request ends.
//!
//! The forwarding layer (`proxy::exchange`) keeps the guard alive as long as the exchange
//! and the scale-to-zero controller (`service::sleep`) supplies what it reports to. This
//! leaf module is the narrow capability between them, so forwarding does not depend on
//! the sleep controller.

use std::fmt;
use std::sync::Arc;

/// Something that counts requests in flight.
pub trait Activity: Send + Sync + 'static {
    /// One request admitted by this owner is over.
    fn request_ended(&self);
}

/// An admitted request. Hold it until the request is really over: for a proxied request
/// that is the end of the response body, for an upgraded connection (WebSocket) the end of
/// the connection. Dropping it ends the request.
#[must_use = "the request counts as in flight only while this guard is held"]
pub struct InFlight(Arc<dyn Activity>);

impl InFlight {
    /// A guard for a request its owner has already counted.
    pub fn new(owner: Arc<dyn Activity>) -> Self {
        InFlight(owner)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}
