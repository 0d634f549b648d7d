//! Raw HTTP/1.x over a `TcpStream`, for tests that must control every byte the client
//! sends (hop-by-hop headers, HTTP/1.0, malformed bodies, unparsed query strings) or see
//! every byte the proxy answers with (status line, exact header names).

use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long any raw exchange may take before the test fails instead of hanging.
const DEADLINE: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct RawResponse {
    /// e.g. `HTTP/1.1 200 OK`
    pub status_line: String,
    pub status: u16,
    /// In the order received, names as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// Connects to the proxy's HTTP port on loopback.
pub async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to proxy")
}

/// Waits until the peer (the proxy) has read every byte written on `stream` so far: the
/// kernel's send queue on our side and its receive queue on the proxy's side are both
/// empty (`/proc/net/tcp`). A positive signal that the proxy took the bytes in, where a
/// sleep would only guess.
pub async fn wait_until_read_by_peer(stream: &TcpStream) {
    let ours = stream.local_addr().expect("local address");
    let theirs = stream.peer_addr().expect("peer address");
    crate::poll::poll_until(
        "the proxy to read every byte sent",
        DEADLINE,
        || async move {
            // The proxy may listen dual-stack: its side is then an IPv4-mapped tcp6 socket.
            let mut table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
            table += &std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
            let send_q = queue(&table, ours, theirs).map(|(tx, _)| tx);
            let recv_q = queue(&table, theirs, ours).map(|(_, rx)| rx);
            (send_q == Some(0) && recv_q == Some(0))
                .then_some(())
                .ok_or((send_q, recv_q))
        },
    )
    .await
}

/// `(tx_queue, rx_queue)` of the IPv4 socket `local` → `remote` in `/proc/net/tcp{,6}`
/// lines, where it may appear as itself or IPv4-mapped.
fn queue(
    table: &str,
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
) -> Option<(u64, u64)> {
    use std::net::SocketAddr;
    // The kernel prints each 32-bit word of an address in host (little-endian) order.
    let v4 = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => (u32::from_le_bytes(v4.ip().octets()), v4.port()),
        SocketAddr::V6(_) => panic!("IPv4 loopback only"),
    };
    let forms = |a: SocketAddr| {
        let (ip, port) = v4(a);
        [
            format!("{ip:08X}:{port:04X}"),
            format!("0000000000000000FFFF0000{ip:08X}:{port:04X}"),
        ]
    };
    let (local, remote) = (forms(local), forms(remote));
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let matches = |field: Option<&&str>, forms: &[String; 2]| {
            field.is_some_and(|v| forms.iter().any(|form| form == v))
        };
        if !matches(f.get(1), &local) || !matches(f.get(2), &remote) {
            return None;
        }
        let (tx, rx) = f.get(4)?.split_once(':')?;
        Some((
            u64::from_str_radix(tx, 16).ok()?,
            u64::from_str_radix(rx, 16).ok()?,
        ))
    })
}

/// Sends `request` verbatim on a fresh connection and reads one response.
pub async fn send(port: u16, request: &[u8]) -> RawResponse {
    let mut stream = connect(port).await;
    stream.write_all(request).await.expect("write request");
    let mut reader = BufReader::new(stream);
    tokio::time::timeout(DEADLINE, read_response(&mut reader, false))
        .await
        .expect("response within the deadline")
}

/// Reads one response (head and body) from `reader`.
pub async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    head_request: bool,
) -> RawResponse {
    let mut status_line = String::new();
    reader
        .read_line(&mut status_line)
        .await
        .expect("read status line");
    assert!(
        !status_line.is_empty(),
        "connection closed before a response"
    );
    let status_line = status_line.trim_end().to_string();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.expect("read header");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("bad header line {line:?}"));
        headers.push((k.to_string(), v.trim().to_string()));
    }
    let mut response = RawResponse {
        status_line,
        status,
        headers,
        body: Vec::new(),
    };
    if head_request || status < 200 || status == 204 || status == 304 {
        return response;
    }
    let chunked = response
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await.expect("read chunk size");
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .unwrap_or_else(|_| panic!("bad chunk size {size:?}"));
            if size == 0 {
                // Trailers, then the final empty line.
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).await.expect("read trailer");
                    if line.trim_end().is_empty() {
                        break;
                    }
                }
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await.expect("read chunk");
            chunk.truncate(size);
            response.body.extend_from_slice(&chunk);
        }
    } else if let Some(len) = response.header("content-length") {
        let len: usize = len.parse().expect("content-length");
        response.body = vec![0; len];
        reader
            .read_exact(&mut response.body)
            .await
            .expect("read body");
    } else {
        reader
            .read_to_end(&mut response.body)
            .await
            .expect("read body to EOF");
    }
    response
}

/// A scripted app on a raw socket: `/up` answers 200, anything else gets `answer` verbatim
/// and the connection is closed right after.
pub async fn scripted_backend(
    answer: &'static [u8],
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                loop {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match stream.read(&mut byte).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => head.push(byte[0]),
                        }
                    }
                    if head.starts_with(b"GET /up ") {
                        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if stream.write_all(ok).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let _ = stream.write_all(answer).await;
                    // Give the bytes time to leave before the close.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return;
                }
            });
        }
    });
    (addr, task)
}
