//! `--scope-cookie-paths` (upstream §4.12): an app deployed below a path prefix sets
//! cookies for the paths it knows (`/`, `/admin`), which the browser would then send to
//! every other app on the host. Under a stripped prefix the proxy moves each cookie of the
//! request's host below the prefix (`/` → `/app`, `/admin` → `/app/admin`).
//!
//! A cookie that is changed is parsed and written again the way Go's `net/http` does
//! (`http.ParseSetCookie`, then `Cookie.String`), so the bytes a browser receives are the
//! bytes Go kamal-proxy would send: attributes in Go's order (Path, Domain, Expires,
//! Max-Age, HttpOnly, Secure, SameSite, Partitioned), unknown attributes dropped, a
//! leading dot of Domain dropped. A cookie that is not changed (another domain, or one Go
//! cannot parse) is left byte for byte as the app sent it.

use http::header::{HeaderMap, HeaderValue, SET_COOKIE};

use super::{is_token, trim_ascii, valid_value_byte};

/// Rewrites the `Set-Cookie` headers of a response to a request with `Host: host_header`
/// that matched the stripped path `prefix`.
pub fn scope_cookie_paths(headers: &mut HeaderMap, prefix: &str, host_header: &str) {
    if !headers.contains_key(SET_COOKIE) {
        return;
    }
    let host = split_host_port(host_header);
    let scoped: Vec<HeaderValue> = headers
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| scope_one(v, prefix, host).unwrap_or_else(|| v.clone()))
        .collect();
    headers.remove(SET_COOKIE);
    for v in scoped {
        headers.append(SET_COOKIE, v);
    }
}

/// Go's `net.SplitHostPort` as upstream uses it: the host without its port, or the whole
/// header where Go reports an error (no port, or an unbracketed IPv6 address).
fn split_host_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once("]:") {
            Some((h, _)) => h,
            None => host,
        };
    }
    match host.split_once(':') {
        Some((h, port)) if !port.contains(':') => h,
        _ => host,
    }
}

/// The cookie moved below `prefix`, or `None` to leave it as it is.
fn scope_one(value: &HeaderValue, prefix: &str, host: &str) -> Option<HeaderValue> {
    let mut cookie = SetCookie::parse(value.to_str().ok()?)?;
    if !(cookie.domain.is_empty() || cookie.domain == host) {
        return None;
    }
    cookie.path = join_path(prefix, cookie.path.trim_matches('/'));
    HeaderValue::from_str(&cookie.to_string()).ok()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SameSite {
    /// Absent or unrecognised: not written back.
    Default,
    Lax,
    Strict,
    None,
}

/// A `Set-Cookie` line as Go's `http.Cookie` holds it.
#[derive(Debug, PartialEq)]
struct SetCookie<'a> {
    name: &'a str,
    value: &'a str,
    quoted: bool,
    path: String,
    domain: &'a str,
    /// Seconds since the Unix epoch, when Expires parsed.
    expires: Option<i64>,
    /// Go's `MaxAge`: 0 absent, < 0 "delete now", > 0 seconds.
    max_age: i64,
    http_only: bool,
    secure: bool,
    same_site: SameSite,
    partitioned: bool,
}

impl<'a> SetCookie<'a> {
    /// `http.ParseSetCookie`: `None` where Go returns an error.
    fn parse(line: &'a str) -> Option<SetCookie<'a>> {
        let mut parts = trim_ascii(line).split(';');
        let first = trim_ascii(parts.next()?);
        let (name, value) = first.split_once('=')?;
        let name = trim_ascii(name);
        if !is_token(name) {
            return None;
        }
        let (value, quoted) = cookie_value(value, true)?;
        let mut c = SetCookie {
            name,
            value,
            quoted,
            path: String::new(),
            domain: "",
            expires: None,
            max_age: 0,
            http_only: false,
            secure: false,
            same_site: SameSite::Default,
            partitioned: false,
        };
        for part in parts {
            let part = trim_ascii(part);
            if part.is_empty() {
                continue;
            }
            let (attr, val) = part.split_once('=').unwrap_or((part, ""));
            if !attr.is_ascii() {
                continue;
            }
            // An attribute whose value Go cannot read is dropped, like an unknown one.
            let Some((val, _)) = cookie_value(val, false) else {
                continue;
            };
            match attr.to_ascii_lowercase().as_str() {
                "samesite" => {
                    c.same_site = match val.to_ascii_lowercase().as_str() {
                        "lax" => SameSite::Lax,
                        "strict" => SameSite::Strict,
                        "none" => SameSite::None,
                        _ => SameSite::Default,
                    }
                }
                "secure" => c.secure = true,
                "httponly" => c.http_only = true,
                "domain" => c.domain = val,
                "max-age" => {
                    // Go's `strconv.Atoi`, and no leading zero on a non-zero value.
                    let digits = val.strip_prefix(['+', '-']).unwrap_or(val);
                    let parsed = (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                        .then(|| val.parse::<i64>().ok())
                        .flatten();
                    match parsed {
                        Some(secs) if secs != 0 && val.starts_with('0') => {}
                        Some(secs) if secs <= 0 => c.max_age = -1,
                        Some(secs) => c.max_age = secs,
                        None => {}
                    }
                }
                "expires" => c.expires = parse_expires(val),
                "path" => c.path = val.to_string(),
                "partitioned" => c.partitioned = true,
                _ => {}
            }
        }
        Some(c)
    }
}

/// `Cookie.String`.
impl std::fmt::Display for SetCookie<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value: String = self
            .value
            .bytes()
            .filter(|b| valid_value_byte(*b))
            .map(char::from)
            .collect();
        if !value.is_empty() && (self.quoted || value.contains([' ', ','])) {
            write!(f, "{}=\"{value}\"", self.name)?;
        } else {
            write!(f, "{}={value}", self.name)?;
        }
        if !self.path.is_empty() {
            let path: String = self
                .path
                .bytes()
                .filter(|b| (0x20..0x7f).contains(b) && *b != b';')
                .map(char::from)
                .collect();
            write!(f, "; Path={path}")?;
        }
        if valid_cookie_domain(self.domain) {
            write!(
                f,
                "; Domain={}",
                self.domain.strip_prefix('.').unwrap_or(self.domain)
            )?;
        }
        if let Some(t) = self.expires.filter(|t| *t >= YEAR_1601) {
            f.write_str("; Expires=")?;
            write_http_date(f, t)?;
        }
        match self.max_age {
            0 => {}
            n if n < 0 => f.write_str("; Max-Age=0")?,
            n => write!(f, "; Max-Age={n}")?,
        }
        if self.http_only {
            f.write_str("; HttpOnly")?;
        }
        if self.secure {
            f.write_str("; Secure")?;
        }
        match self.same_site {
            SameSite::Default => {}
            SameSite::None => f.write_str("; SameSite=None")?,
            SameSite::Lax => f.write_str("; SameSite=Lax")?,
            SameSite::Strict => f.write_str("; SameSite=Strict")?,
        }
        if self.partitioned {
            f.write_str("; Partitioned")?;
        }
        Ok(())
    }
}

/// Go's `parseCookieValue`: optional surrounding quotes (only where allowed), then only
/// bytes a cookie value may hold.
fn cookie_value(raw: &str, allow_quotes: bool) -> Option<(&str, bool)> {
    let (value, quoted) = match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) if allow_quotes => (inner, true),
        _ => (raw, false),
    };
    value
        .bytes()
        .all(valid_value_byte)
        .then_some((value, quoted))
}

/// `path.Join(prefix, rest)`, cleaned as Go cleans it.
fn join_path(prefix: &str, rest: &str) -> String {
    let joined = if rest.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix}/{rest}")
    };
    let mut segments: Vec<&str> = Vec::new();
    for s in joined.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(joined.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// Go's `validCookieDomain`: a domain name with at least one letter, or an IPv4 address.
fn valid_cookie_domain(d: &str) -> bool {
    if d.is_empty() {
        return false;
    }
    if d.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let s = d.strip_prefix('.').unwrap_or(d);
    if s.is_empty() || d.len() > 255 {
        return false;
    }
    let mut last = b'.';
    let mut letter = false;
    let mut part = 0;
    for c in s.bytes() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {
                letter = true;
                part += 1;
            }
            b'0'..=b'9' => part += 1,
            b'-' if last != b'.' => part += 1,
            b'.' if last != b'.' && last != b'-' && (1..=63).contains(&part) => part = 0,
            _ => return false,
        }
        last = c;
    }
    last != b'-' && part <= 63 && letter
}

/// 1601-01-01T00:00:00Z: Go writes no Expires before it.
const YEAR_1601: i64 = -11_644_473_600;

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Go's `http.TimeFormat` (`Mon, 02 Jan 2006 15:04:05 GMT`).
pub(super) fn write_http_date(out: &mut impl std::fmt::Write, unix: i64) -> std::fmt::Result {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    write!(
        out,
        "{weekday}, {day:02} {} {year:04} {:02}:{:02}:{:02} GMT",
        MONTHS[(month - 1) as usize],
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Go's `time.Parse` with `time.RFC1123`, then with `Mon, 02-Jan-2006 15:04:05 MST`; a
/// zone abbreviation counts as UTC (Go gives an unknown one a zero offset, and the
/// upstream image runs in UTC).
fn parse_expires(s: &str) -> Option<i64> {
    parse_date(s, ' ').or_else(|| parse_date(s, '-'))
}

fn parse_date(s: &str, sep: char) -> Option<i64> {
    let (weekday, rest) = s.split_at_checked(3)?;
    if !DAYS.iter().any(|d| d.eq_ignore_ascii_case(weekday)) {
        return None;
    }
    let rest = rest.strip_prefix(", ")?;
    let (day, rest) = fixed_digits(rest, 2)?;
    let rest = rest.strip_prefix(sep)?;
    let (month, rest) = rest.split_at_checked(3)?;
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(month))? as i64 + 1;
    let rest = rest.strip_prefix(sep)?;
    let (year, rest) = fixed_digits(rest, 4)?;
    let rest = rest.strip_prefix(' ')?;
    // Go's `15` takes one or two digits; `04` and `05` exactly two.
    let (hour, rest) = fixed_digits(rest, 2).or_else(|| fixed_digits(rest, 1))?;
    let (minute, rest) = fixed_digits(rest.strip_prefix(':')?, 2)?;
    let (second, mut rest) = fixed_digits(rest.strip_prefix(':')?, 2)?;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &fraction[digits..];
    }
    let zone = rest.strip_prefix(' ')?;
    if zone.len() < 3 || !zone.bytes().all(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if day < 1 || day > month_days[(month - 1) as usize] || hour > 23 || minute > 59 || second > 59
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

fn fixed_digits(s: &str, n: usize) -> Option<(i64, &str)> {
    let (digits, rest) = s.split_at_checked(n)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, rest))
}

/// Howard Hinnant's `days_from_civil`: days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scoped(lines: &[&str], prefix: &str, host: &str) -> Vec<String> {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(SET_COOKIE, HeaderValue::from_str(l).unwrap());
        }
        scope_cookie_paths(&mut h, prefix, host);
        h.get_all(SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn paths_move_below_the_prefix() {
        // Upstream's TestRouter_PathBasedRoutingCookiePrefixPrefix cases.
        assert_eq!(
            scoped(&["session=1; Path=/something"], "/app", "a.test"),
            ["session=1; Path=/app/something"]
        );
        assert_eq!(
            scoped(&["chat=1; Path=/"], "/chat", "a.test"),
            ["chat=1; Path=/chat"]
        );
        assert_eq!(scoped(&["x=1"], "/api", "a.test"), ["x=1; Path=/api"]);
        assert_eq!(
            scoped(&["x=1; Path=/admin/"], "/api", "a.test"),
            ["x=1; Path=/api/admin"]
        );
        assert_eq!(
            scoped(&["x=1; Path=/a/../b"], "/api", "a.test"),
            ["x=1; Path=/api/b"]
        );
    }

    #[test]
    fn only_cookies_of_the_request_host_change_and_order_is_kept() {
        let out = scoped(
            &[
                "first=1; Path=/; Domain=a.test",
                "third=3; Path=/; Domain=other.test",
                "none=2; Path=/x",
                "dotted=4; Path=/; Domain=.a.test",
                "broken; Path=/",
            ],
            "/app",
            "a.test",
        );
        assert_eq!(
            out,
            [
                "first=1; Path=/app; Domain=a.test",
                "third=3; Path=/; Domain=other.test",
                "none=2; Path=/app/x",
                // Go compares the attribute as written: `.a.test` is not `a.test`.
                "dotted=4; Path=/; Domain=.a.test",
                "broken; Path=/",
            ]
        );
    }

    #[test]
    fn rewritten_cookies_are_written_as_go_writes_them() {
        let out = scoped(
            &[
                "id=\"a b\"; secure; SameSite=lax; HttpOnly; Max-Age=60; Foo=bar; expires=Wed, 21 Oct 2015 07:28:00 GMT; path=/",
            ],
            "/app",
            "a.test",
        );
        assert_eq!(
            out,
            [
                "id=\"a b\"; Path=/app; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Max-Age=60; HttpOnly; Secure; SameSite=Lax"
            ]
        );
        let out = scoped(
            &["gone=; Max-Age=0; Expires=Thu, 01-Jan-1970 00:00:00 UTC; Partitioned; SameSite=odd"],
            "/app",
            "a.test",
        );
        assert_eq!(
            out,
            ["gone=; Path=/app; Expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=0; Partitioned"]
        );
        // A leading zero makes Go ignore Max-Age; an unparseable date drops Expires.
        let out = scoped(&["a=1; Max-Age=010; Expires=tomorrow"], "/app", "a.test");
        assert_eq!(out, ["a=1; Path=/app"]);
    }

    #[test]
    fn dates_round_trip() {
        let t = parse_expires("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(t, 784_111_777);
        let mut s = String::new();
        write_http_date(&mut s, t).unwrap();
        assert_eq!(s, "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            parse_expires("Mon, 29 Feb 2021 00:00:00 GMT"),
            None,
            "not a leap year"
        );
        assert_eq!(
            parse_expires("Sun, 6 Nov 1994 08:49:37 GMT"),
            None,
            "two-digit day"
        );
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn the_host_loses_its_port_as_go_splits_it() {
        assert_eq!(split_host_port("a.test:8080"), "a.test");
        assert_eq!(split_host_port("a.test"), "a.test");
        assert_eq!(split_host_port("[::1]:80"), "::1");
        assert_eq!(split_host_port("[::1]"), "[::1]");
        assert_eq!(split_host_port("::1"), "::1");
        assert_eq!(
            scoped(&["x=1; Domain=a.test"], "/app", "a.test:8080"),
            ["x=1; Path=/app; Domain=a.test"]
        );
    }

    #[test]
    fn domains() {
        assert!(valid_cookie_domain("a.test"));
        assert!(valid_cookie_domain("localhost"));
        assert!(valid_cookie_domain("127.0.0.1"));
        assert!(!valid_cookie_domain("a_b.test"));
        assert!(!valid_cookie_domain("123"));
    }
}
