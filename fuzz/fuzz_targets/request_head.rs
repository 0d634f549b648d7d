//! HTTP/1 request heads, as our server connection reads them from a client: whatever
//! comes, no panic; a head it does not take leaves the bytes exactly as they came (hyper
//! reads them next); and a decision taken on the first bytes is the one all of them give.
#![no_main]

use bytes::BytesMut;
use kamal_proxy::server::h1::request::{Parsed, parse};
use libfuzzer_sys::fuzz_target;

/// The bytes `parse` took, or `None` for "not yet" (`Some(None)`: not ours).
fn taken(data: &[u8], max_head: usize) -> Option<Option<usize>> {
    let mut buf = BytesMut::from(data);
    match parse(&mut buf, max_head) {
        Parsed::Request { .. } => {
            assert_eq!(&buf[..], &data[data.len() - buf.len()..]);
            Some(Some(data.len() - buf.len()))
        }
        Parsed::Partial => {
            assert_eq!(&buf[..], data);
            None
        }
        Parsed::Elsewhere => {
            assert_eq!(&buf[..], data);
            Some(None)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let max_head = 1024;
    let whole = taken(data, max_head);
    for cut in 0..data.len() {
        if let Some(part) = taken(&data[..cut], max_head) {
            // A head taken from a prefix is the same head; a prefix refused may only be
            // one that grew past the limit or went wrong, which more bytes cannot undo.
            assert_eq!(Some(part), whole, "decided at {cut}");
            break;
        }
    }
});
