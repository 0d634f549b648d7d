//! A plain HTTP client for the tests and what it saw.

/// An HTTP client that never uses a proxy from the environment and keeps connections.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// What a client saw: status, headers and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Reply {
    /// A response header as text ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// Sends `method url` with an optional `Host` header and reads the whole response.
pub async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    host: Option<&str>,
) -> Result<Reply, reqwest::Error> {
    send_with_cookie(client, method, url, host, None).await
}

/// [`send`] with a `Cookie` header when `cookie` is given.
pub async fn send_with_cookie(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    host: Option<&str>,
    cookie: Option<&str>,
) -> Result<Reply, reqwest::Error> {
    let mut req = client.request(method, url);
    if let Some(h) = host {
        req = req.header(reqwest::header::HOST, h);
    }
    if let Some(c) = cookie {
        req = req.header(reqwest::header::COOKIE, c);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
