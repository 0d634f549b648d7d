//! Error pages the proxy renders itself: the built-in pages, or a service's own templates
//! from `--error-pages` (Go `html/template` files named `<status>.html`; we support the
//! subset Kamal apps use: `{{ .Message }}` and `{{ if .Message }}…{{ else }}…{{ end }}`).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::body::ResponseBody;

const CONTENT_TYPE_HTML: &str = "text/html; charset=utf-8";

struct BuiltIn {
    status: u16,
    title: &'static str,
    text: &'static str,
}

const BUILT_IN: &[BuiltIn] = &[
    BuiltIn {
        status: 404,
        title: "Not Found",
        text: "The page you were looking for doesn’t exist. You may have mistyped the address or the page may have moved.",
    },
    BuiltIn {
        status: 413,
        title: "Content Too Large",
        text: "The file or data you are trying to upload exceeds the allowed size. Please try again with a smaller file.",
    },
    BuiltIn {
        status: 502,
        title: "Bad Gateway",
        text: "The server received an invalid response. Please try again later.",
    },
    BuiltIn {
        status: 503,
        title: "Service Temporarily Unavailable",
        text: "The service is temporarily unavailable. It may be overloaded, or undergoing scheduled maintenance. Please try again later.",
    },
    BuiltIn {
        status: 504,
        title: "Gateway Timeout",
        text: "The service did not respond within the allowed time limit. Please try again later.",
    },
];

fn built_in_page(status: u16, message: Option<&str>) -> Option<String> {
    let page = BUILT_IN.iter().find(|p| p.status == status)?;
    let text = match message {
        Some(m) if !m.is_empty() => html_escape(m),
        _ => page.text.to_string(),
    };
    Some(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<title>{status} — {title}</title>\n<style>\n\
body {{ background: #0971D5; color: #fff; font-family: system-ui, -apple-system, sans-serif; \
margin: 0; min-height: 100vh; display: grid; place-items: center; text-align: center; }}\n\
main {{ max-width: 36rem; padding: 2rem; }}\n\
h1 {{ font-size: 6rem; margin: 0; letter-spacing: -0.05em; }}\n\
p {{ font-size: 1.25rem; line-height: 1.5; }}\n</style>\n</head>\n<body>\n<main>\n\
<h1>{status}</h1>\n<p><strong>{title}</strong></p>\n<p>{text}</p>\n</main>\n</body>\n</html>\n",
        title = page.title,
    ))
}

pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A parsed template: literal text interleaved with the message and conditionals.
#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Message,
    IfMessage(Vec<Node>, Vec<Node>),
}

fn parse_template(src: &str) -> Result<Vec<Node>, String> {
    let mut tokens = Vec::new();
    let mut rest = src;
    while let Some(start) = rest.find("{{") {
        tokens.push((false, &rest[..start]));
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or("unclosed action")?;
        tokens.push((
            true,
            after[..end].trim_matches(|c: char| c == '-' || c.is_whitespace()),
        ));
        rest = &after[end + 2..];
    }
    tokens.push((false, rest));
    let mut iter = tokens.into_iter();
    let (nodes, terminator) = parse_nodes(&mut iter)?;
    match terminator {
        None => Ok(nodes),
        Some(t) => Err(format!("unexpected {{{{{t}}}}}")),
    }
}

fn parse_nodes<'a>(
    iter: &mut impl Iterator<Item = (bool, &'a str)>,
) -> Result<(Vec<Node>, Option<&'a str>), String> {
    let mut nodes = Vec::new();
    while let Some((is_action, text)) = iter.next() {
        if !is_action {
            if !text.is_empty() {
                nodes.push(Node::Text(text.to_string()));
            }
            continue;
        }
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.as_slice() {
            [".Message"] => nodes.push(Node::Message),
            ["if", ".Message"] => {
                let (then, term) = parse_nodes(iter)?;
                let otherwise = match term {
                    Some("end") => Vec::new(),
                    Some("else") => match parse_nodes(iter)? {
                        (nodes, Some("end")) => nodes,
                        _ => return Err("missing {{end}}".into()),
                    },
                    _ => return Err("missing {{end}}".into()),
                };
                nodes.push(Node::IfMessage(then, otherwise));
            }
            ["end"] => return Ok((nodes, Some("end"))),
            ["else"] => return Ok((nodes, Some("else"))),
            [] => {}
            _ if text.starts_with("/*") => {}
            _ => return Err(format!("unsupported action {{{{{text}}}}}")),
        }
    }
    Ok((nodes, None))
}

fn render_nodes(nodes: &[Node], message: &str, out: &mut String) {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Message => out.push_str(&html_escape(message)),
            Node::IfMessage(a, b) => {
                render_nodes(if message.is_empty() { b } else { a }, message, out)
            }
        }
    }
}

/// A service's custom pages, loaded at deploy time.
#[derive(Debug, Default)]
pub struct ErrorPages {
    pages: HashMap<u16, Vec<Node>>,
    /// `wake.html`: the `--wake-page` waiting page (`{{ .Message }}` is the service name).
    wake: Option<Vec<Node>>,
}

impl ErrorPages {
    /// Every `*.html` in `dir` must parse and there must be at least one, as upstream.
    pub fn load(dir: &Path) -> Result<ErrorPages, String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut pages = HashMap::new();
        let mut wake = None;
        let mut found = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("html") {
                continue;
            }
            found += 1;
            let src =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let nodes = parse_template(&src).map_err(|e| format!("{}: {e}", path.display()))?;
            if path.file_stem().and_then(|s| s.to_str()) == Some("wake") {
                wake = Some(nodes);
                continue;
            }
            if let Some(status) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u16>().ok())
            {
                pages.insert(status, nodes);
            }
        }
        if found == 0 {
            return Err(format!("{}: no *.html error pages", dir.display()));
        }
        Ok(ErrorPages { pages, wake })
    }

    fn render(&self, status: u16, message: &str) -> Option<String> {
        let nodes = self.pages.get(&status)?;
        let mut out = String::new();
        render_nodes(nodes, message, &mut out);
        Some(out)
    }
}

/// The page body for a proxy-generated status: the service's template, else the built-in
/// page, else `<h1>500 Internal Server Error</h1>` style text.
pub fn page_body(status: StatusCode, custom: Option<&ErrorPages>, message: Option<&str>) -> String {
    let code = status.as_u16();
    if let Some(body) = custom.and_then(|p| p.render(code, message.unwrap_or(""))) {
        return body;
    }
    built_in_page(code, message).unwrap_or_else(|| {
        format!(
            "<h1>{} {}</h1>",
            code,
            status.canonical_reason().unwrap_or("")
        )
    })
}

/// The `--wake-page` body: the service's `wake.html`, else a small built-in page that
/// names the service (never a container) and reloads itself every `refresh_secs`.
pub fn wake_page_body(service: &str, custom: Option<&ErrorPages>, refresh_secs: u64) -> String {
    if let Some(nodes) = custom.and_then(|p| p.wake.as_ref()) {
        let mut out = String::new();
        render_nodes(nodes, service, &mut out);
        return out;
    }
    let service = html_escape(service);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
<meta http-equiv=\"refresh\" content=\"{refresh_secs}\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<title>Starting {service}…</title>\n<style>\n\
body {{ background: #0971D5; color: #fff; font-family: system-ui, -apple-system, sans-serif; \
margin: 0; min-height: 100vh; display: grid; place-items: center; text-align: center; }}\n\
main {{ max-width: 36rem; padding: 2rem; }}\n\
p {{ font-size: 1.25rem; line-height: 1.5; }}\n</style>\n</head>\n<body>\n<main>\n\
<h1>Starting {service}…</h1>\n<p>The service is waking up. This page reloads by itself.</p>\n\
</main>\n</body>\n</html>\n"
    )
}

pub fn error_response(
    status: StatusCode,
    custom: Option<&Arc<ErrorPages>>,
    message: Option<&str>,
) -> Response<ResponseBody> {
    let body = page_body(status, custom.map(|p| p.as_ref()), message);
    let mut response = Response::new(ResponseBody::full(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_HTML),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_pages_and_fallback() {
        let b = page_body(StatusCode::SERVICE_UNAVAILABLE, None, None);
        assert!(b.contains("503 — Service Temporarily Unavailable"));
        assert!(b.contains("temporarily unavailable"));
        let b = page_body(StatusCode::SERVICE_UNAVAILABLE, None, Some("Back <soon>"));
        assert!(b.contains("Back &lt;soon&gt;"));
        assert_eq!(
            page_body(StatusCode::INTERNAL_SERVER_ERROR, None, None),
            "<h1>500 Internal Server Error</h1>"
        );
    }

    #[test]
    fn templates() {
        let nodes =
            parse_template("<p>{{ if .Message }}M: {{ .Message }}{{ else }}none{{ end }}</p>")
                .unwrap();
        let mut out = String::new();
        render_nodes(&nodes, "a&b", &mut out);
        assert_eq!(out, "<p>M: a&amp;b</p>");
        out.clear();
        render_nodes(&nodes, "", &mut out);
        assert_eq!(out, "<p>none</p>");
        assert!(parse_template("{{ if .Message }}x").is_err());
        assert!(parse_template("{{ .Foo }}").is_err());
    }

    #[test]
    fn the_wake_page_names_the_service_escaped_and_wake_html_replaces_it() {
        let b = wake_page_body("app<web>", None, 2);
        assert!(b.contains("Starting app&lt;web&gt;…"), "{b}");
        assert!(
            b.contains("<meta http-equiv=\"refresh\" content=\"2\">"),
            "{b}"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wake.html"), "Wait for {{ .Message }}").unwrap();
        let pages = ErrorPages::load(dir.path()).unwrap();
        assert_eq!(wake_page_body("app", Some(&pages), 2), "Wait for app");
        // wake.html is not a status page.
        assert!(page_body(StatusCode::SERVICE_UNAVAILABLE, Some(&pages), None).contains("503"));
    }

    #[test]
    fn load_requires_html_files() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ErrorPages::load(dir.path()).is_err());
        std::fs::write(dir.path().join("503.html"), "Down: {{ .Message }}").unwrap();
        let pages = ErrorPages::load(dir.path()).unwrap();
        assert_eq!(
            page_body(StatusCode::SERVICE_UNAVAILABLE, Some(&pages), Some("x")),
            "Down: x"
        );
        // Statuses without a template fall back to the built-in page.
        assert!(page_body(StatusCode::BAD_GATEWAY, Some(&pages), None).contains("502"));
        assert!(ErrorPages::load(&dir.path().join("missing")).is_err());
    }
}
