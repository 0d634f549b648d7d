//! Numbers and addresses as text, without `core::fmt`: every request formats an IP address
//! (`X-Forwarded-For`, the access line's `client_addr` and `remote_addr`) and a dozen
//! integers (`X-Request-Start`, the access line), and going through `fmt`'s padding
//! machinery cost more than the proxy's own header work (bench/README.md).

use std::mem::MaybeUninit;
use std::net::IpAddr;

/// An IP address rendered on the stack.
#[derive(Clone, Copy)]
pub struct IpText {
    buf: [u8; 45],
    len: usize,
}

impl IpText {
    pub fn new(ip: IpAddr) -> Self {
        // 45 bytes hold the longest textual IPv6 address (IPv4-mapped form).
        let mut buf = [0u8; 45];
        let len = match ip {
            IpAddr::V4(v4) => {
                let mut len = 0;
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        buf[len] = b'.';
                        len += 1;
                    }
                    let digits = Decimal::new(u64::from(octet));
                    let d = digits.as_bytes();
                    buf[len..len + d.len()].copy_from_slice(d);
                    len += d.len();
                }
                len
            }
            // Rare on the hot path, and its zero-run compression is fmt's to get right.
            IpAddr::V6(_) => {
                use std::io::Write;
                let mut cursor = std::io::Cursor::new(&mut buf[..]);
                let _ = write!(cursor, "{ip}");
                cursor.position() as usize
            }
        };
        IpText { buf, len }
    }

    /// As [`IpText::new`], from the thread's last address when it is the same: the
    /// requests of a keep-alive connection repeat it (as do those of clients behind one
    /// proxy), and rendering one took about 200 instructions.
    pub fn of(ip: IpAddr) -> Self {
        thread_local! {
            static LAST: std::cell::Cell<Option<(IpAddr, IpText)>> =
                const { std::cell::Cell::new(None) };
        }
        LAST.with(|last| match last.get() {
            Some((seen, text)) if seen == ip => text,
            _ => {
                let text = IpText::new(ip);
                last.set(Some((ip, text)));
                text
            }
        })
    }

    pub fn as_str(&self) -> &str {
        ascii(&self.buf[..self.len])
    }
}

/// An unsigned integer in decimal, on the stack.
pub struct Decimal {
    buf: [u8; 20],
    start: usize,
}

/// "00" to "99": two digits per division.
const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

impl Decimal {
    pub fn new(mut n: u64) -> Self {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        while n >= 100 {
            let pair = (n % 100) as usize * 2;
            n /= 100;
            start -= 2;
            buf[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = n as usize * 2;
            start -= 2;
            buf[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            start -= 1;
            buf[start] = b'0' + n as u8;
        }
        Decimal { buf, start }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    pub fn as_str(&self) -> &str {
        ascii(self.as_bytes())
    }
}

/// Writes `n` into all of `buf`, zero-padded on the left (the leading digits of a larger
/// `n` are dropped), two digits per division.
pub fn put_padded(buf: &mut [u8], n: u64) {
    // SAFETY: `MaybeUninit<u8>` has `u8`'s layout, and `fill_digits` only writes
    // initialised bytes, so `buf` stays initialised.
    let slots = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
    fill_digits(slots, n);
}

/// Writes every byte of `out`: `n`'s last `out.len()` decimal digits, zero-padded on the
/// left, two digits per division.
fn fill_digits(out: &mut [MaybeUninit<u8>], mut n: u64) {
    let mut end = out.len();
    while end >= 2 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        out[end - 2].write(PAIRS[pair]);
        out[end - 1].write(PAIRS[pair + 1]);
        end -= 2;
    }
    if end == 1 {
        out[0].write(b'0' + (n % 10) as u8);
    }
}

/// Digits, dots, colons and hex letters as `&str`. Checking them with `from_utf8` was
/// 1,700 instructions a request (bench/README.md): about 150 a call, for a few bytes.
pub(crate) fn ascii(bytes: &[u8]) -> &str {
    debug_assert!(bytes.is_ascii());
    // SAFETY: the callers' buffers hold only ASCII they wrote themselves (digits and
    // separators, or `Display` of an IP address), and ASCII is valid UTF-8.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text_matches_display() {
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "10.20.3.40",
            "::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
            "2001:db8::42",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
            // Twice: the second from the thread's last address.
            assert_eq!(IpText::of(ip).as_str(), ip.to_string());
            assert_eq!(IpText::of(ip).as_str(), ip.to_string());
        }
    }

    #[test]
    fn padded_digits_fill_the_buffer() {
        for (n, width, want) in [
            (0u64, 1, "0"),
            (7, 4, "0007"),
            (2026, 4, "2026"),
            (5, 2, "05"),
            (120_000_000, 9, "120000000"),
            (1, 9, "000000001"),
            (999_999_999, 9, "999999999"),
            (12_345, 3, "345"),
        ] {
            let mut buf = vec![b'x'; width];
            put_padded(&mut buf, n);
            assert_eq!(std::str::from_utf8(&buf).unwrap(), want, "{n} in {width}");
        }
    }

    #[test]
    fn integers_match_display() {
        for n in [
            0u64,
            1,
            9,
            10,
            99,
            100,
            12345,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            assert_eq!(Decimal::new(n).as_str(), n.to_string());
        }
        // Every length and digit pair (two digits are written per division).
        for n in (0..=100_000u64).chain((1..20).map(|e| 10u64.pow(e) - 1)) {
            assert_eq!(Decimal::new(n).as_str(), n.to_string());
            assert_eq!(Decimal::new(n + 1).as_str(), (n + 1).to_string());
        }
    }
}
