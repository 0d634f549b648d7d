//! Address lists (`--allow-ip`, `--trusted-proxy`) and forwarded chains.
#![no_main]

use http::{HeaderMap, HeaderValue};
use kamal_proxy::service::gates::client_ip::{ClientResolver, IpList};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &[u8], [u8; 16])| {
    let (entries, header, peer) = input;
    let entries: Vec<String> = entries.split(',').map(str::to_string).collect();
    let peer = std::net::IpAddr::from(peer);
    if let Ok(list) = IpList::parse(&entries, "allow-ip") {
        let _ = list.contains(peer);
    }
    let trusted =
        IpList::parse(&["0.0.0.0/1".into(), "::/1".into()], "trusted-proxy").expect("a valid list");
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_bytes(header) {
        headers.append("x-forwarded-for", v.clone());
        headers.append("x-forwarded-for", v);
    }
    let _ = ClientResolver::new(trusted, "").resolve(peer, &headers);
});
