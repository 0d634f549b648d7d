//! The `PATTERN=REPLACEMENT` grammar shared by `--redirect` and `--rewrite`: split at the
//! first `=`, an optional trailing `;status=N` (redirects only), the pattern anchored to
//! the whole decoded path, `$1`-style expansion, first match wins. Compiled at deploy.

use regex::Regex;

use crate::uri::{encode_query, split_query};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redirect,
    Rewrite,
}

impl Kind {
    fn flag(self) -> &'static str {
        match self {
            Kind::Redirect => "redirect",
            Kind::Rewrite => "rewrite",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Rule {
    pattern: Regex,
    /// The replacement's path and its own query, split before expansion: a `?` the
    /// client sent (as `%3F`) and a capture carried into the path stays in the path.
    path: String,
    query: Option<String>,
    pub status: u16,
}

/// What a matching rule expands to. The path is decoded text (`encode_path` it for the
/// wire); the query is ready for the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expansion {
    pub path: String,
    pub query: Option<String>,
    pub status: u16,
}

#[derive(Debug, Clone, Default)]
pub struct RuleSet(Vec<Rule>);

impl RuleSet {
    pub fn parse(rules: &[String], kind: Kind) -> Result<RuleSet, String> {
        rules
            .iter()
            .map(|r| parse_rule(r, kind))
            .collect::<Result<Vec<_>, _>>()
            .map(RuleSet)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first rule matching the whole `path`, expanded, with its status.
    pub fn apply(&self, path: &str) -> Option<Expansion> {
        self.0.iter().find_map(|rule| {
            // A miss (the usual case) costs no allocation for capture slots.
            if !rule.pattern.is_match(path) {
                return None;
            }
            let caps = rule.pattern.captures(path)?;
            let mut out = String::new();
            caps.expand(&rule.path, &mut out);
            let query = rule.query.as_ref().map(|q| {
                let mut expanded = String::new();
                caps.expand(q, &mut expanded);
                encode_query(&expanded)
            });
            Some(Expansion {
                path: out,
                query,
                status: rule.status,
            })
        })
    }
}

fn parse_rule(rule: &str, kind: Kind) -> Result<Rule, String> {
    let flag = kind.flag();
    let Some((pattern, rest)) = rule.split_once('=') else {
        return Err(format!(
            "{flag} must be given as \"<pattern>=<replacement>\", got \"{rule}\""
        ));
    };
    let (replacement, status) = match rest.rsplit_once(";status=") {
        Some((r, n)) if n.parse::<i64>().is_ok() => (r, n.parse::<i64>().ok()),
        _ => (rest, None),
    };
    if pattern.is_empty() {
        return Err(format!("{flag} needs a pattern"));
    }
    if replacement.is_empty() {
        return Err(format!("{flag} needs a replacement"));
    }
    let status = match (kind, status) {
        (Kind::Rewrite, Some(_)) => return Err("rewrite cannot set a status".into()),
        (Kind::Redirect, Some(n)) if [301, 302, 303, 307, 308].contains(&n) => n as u16,
        (Kind::Redirect, Some(n)) => {
            return Err(format!(
                "redirect status must be one of 301, 302, 303, 307, 308, got {n}"
            ));
        }
        (_, None) => 301,
    };
    match kind {
        Kind::Rewrite if !replacement.starts_with('/') => {
            return Err(format!(
                "rewrite replacement must be an absolute path, got \"{replacement}\""
            ));
        }
        Kind::Redirect if !(replacement.starts_with('/') || is_full_url(replacement)) => {
            return Err(format!(
                "redirect replacement must be an absolute path or a full URL, got \"{replacement}\""
            ));
        }
        _ => {}
    }
    let compiled = Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
        format!(
            "{flag} has an invalid pattern \"{pattern}\": {}",
            regex_error(&e)
        )
    })?;
    let (path, query) = split_query(replacement);
    Ok(Rule {
        pattern: compiled,
        path: path.to_string(),
        query: query.map(str::to_string),
        status,
    })
}

pub fn is_full_url(s: &str) -> bool {
    // Compared as bytes: the expanded replacement carries the client's decoded path, and
    // slicing the `str` at the scheme's length could cut a multi-byte character (a panic
    // a client could trigger at will).
    let s = s.as_bytes();
    [&b"http://"[..], &b"https://"[..]]
        .iter()
        .any(|scheme| s.len() > scheme.len() && s[..scheme.len()].eq_ignore_ascii_case(scheme))
}

/// regex's syntax errors span several lines (the pattern with a caret); keep the message.
fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(&text)
        .trim()
        .trim_start_matches("error: ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(rules: &[&str], kind: Kind) -> RuleSet {
        RuleSet::parse(
            &rules.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            kind,
        )
        .unwrap()
    }

    fn expansion(path: &str, query: Option<&str>, status: u16) -> Expansion {
        Expansion {
            path: path.into(),
            query: query.map(Into::into),
            status,
        }
    }

    /// A `?` in what the client sent (`%3F`, decoded before matching) stays part of the
    /// path: splitting the expansion made it a query separator, so a client could replace
    /// the query the target sees (found by the property tests). Captures in the
    /// replacement's own query are encoded for the wire.
    #[test]
    fn captured_text_never_becomes_a_query() {
        let s = set(
            &["/old/(.*)=/new/$1", "/q/(.*)=/search?q=$1"],
            Kind::Rewrite,
        );
        assert_eq!(
            s.apply("/old/a?admin=1"),
            Some(expansion("/new/a?admin=1", None, 301))
        );
        assert_eq!(
            s.apply("/q/a b\u{e9}#x"),
            Some(expansion("/search", Some("q=a%20b%C3%A9%23x"), 301))
        );
    }

    fn err(rule: &str, kind: Kind) -> String {
        RuleSet::parse(&[rule.to_string()], kind).unwrap_err()
    }

    #[test]
    fn grammar() {
        let s = set(&["/old/(.*)=/new/$1;status=308", "/a=/b=c"], Kind::Redirect);
        assert_eq!(s.apply("/old/x/y"), Some(expansion("/new/x/y", None, 308)));
        // Split at the first `=`: the pattern is "/a", the replacement "/b=c".
        assert_eq!(s.apply("/a"), Some(expansion("/b=c", None, 301)));
        let s = set(&["/a=/b;status=x"], Kind::Redirect);
        assert_eq!(s.apply("/a"), Some(expansion("/b;status=x", None, 301)));
    }

    #[test]
    fn anchored_first_match_wins() {
        let s = set(
            &["/blog=/news", "/blog/(.*)=/news/$1", "/.*=/all"],
            Kind::Rewrite,
        );
        assert_eq!(s.apply("/blog").unwrap().path, "/news");
        assert_eq!(s.apply("/blog/1").unwrap().path, "/news/1");
        assert_eq!(s.apply("/x/blog").unwrap().path, "/all");
        assert!(
            set(&["/blog=/news"], Kind::Rewrite)
                .apply("/blogs")
                .is_none()
        );
        assert!(RuleSet::default().apply("/").is_none());
    }

    #[test]
    fn errors_in_the_forks_words() {
        assert_eq!(
            err("nope", Kind::Redirect),
            "redirect must be given as \"<pattern>=<replacement>\", got \"nope\""
        );
        assert_eq!(err("=/x", Kind::Rewrite), "rewrite needs a pattern");
        assert_eq!(err("/x=", Kind::Redirect), "redirect needs a replacement");
        assert_eq!(
            err("/x=;status=301", Kind::Redirect),
            "redirect needs a replacement"
        );
        assert!(
            err("/(x=/y", Kind::Redirect).starts_with("redirect has an invalid pattern \"/(x\": ")
        );
        assert_eq!(
            err("/x=y", Kind::Rewrite),
            "rewrite replacement must be an absolute path, got \"y\""
        );
        assert_eq!(
            err("/x=https://a.com;status=302", Kind::Rewrite),
            "rewrite cannot set a status"
        );
        assert_eq!(
            err("/x=ftp://y", Kind::Redirect),
            "redirect replacement must be an absolute path or a full URL, got \"ftp://y\""
        );
        assert_eq!(
            err("/x=/y;status=200", Kind::Redirect),
            "redirect status must be one of 301, 302, 303, 307, 308, got 200"
        );
        assert!(RuleSet::parse(&["/x=https://a.com/y;status=302".into()], Kind::Redirect).is_ok());
    }

    /// A replacement with a multi-byte character across the scheme's length panicked
    /// (found while writing the `rules` fuzz target, which now covers it).
    #[test]
    fn full_url_check_on_multibyte_text() {
        assert!(!is_full_url("http:/\u{e9}\u{e9}"));
        assert!(!is_full_url("/abcde\u{e9}x"));
        assert!(!is_full_url("https:/\u{1F600}"));
        assert!(is_full_url("HTTPS://\u{e9}"));
        assert_eq!(
            err("/x=http:/\u{e9}\u{e9}", Kind::Redirect),
            "redirect replacement must be an absolute path or a full URL, got \"http:/\u{e9}\u{e9}\""
        );
    }
}
