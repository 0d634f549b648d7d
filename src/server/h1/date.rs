//! The `Date` header every response carries, formatted once a second per thread (as
//! hyper does) rather than per response.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `Sun, 06 Nov 1994 08:49:37 GMT`
pub const LEN: usize = 29;

struct Cached {
    second: u64,
    text: [u8; LEN],
}

thread_local! {
    static CACHED: RefCell<Cached> = const { RefCell::new(Cached { second: 0, text: [0; LEN] }) };
}

/// Appends the current date in the HTTP format.
pub fn extend(out: &mut Vec<u8>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.second != now {
            let text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(now));
            if text.len() != LEN {
                // Past the year 9999: not worth caching.
                out.extend_from_slice(text.as_bytes());
                return;
            }
            cached.text.copy_from_slice(text.as_bytes());
            cached.second = now;
        }
        out.extend_from_slice(&cached.text);
    });
}
