//! [`ContainerLifecycle`] over the Docker Engine API on a Unix socket, through bollard.
//!
//! Two things bollard 0.21 does not do for us, and why we do them here:
//!
//! * **Versioned paths.** bollard builds its URL by joining an absolute path onto
//!   `…/v1.NN`, which replaces the version prefix: every request goes out unversioned
//!   (`POST /containers/x/start`), so its own `negotiate_version` changes nothing on the
//!   wire. We negotiate ourselves and put `/v<version>` back with a request modifier,
//!   so the engine answers at an API version we understand rather than its newest one.
//! * **Reference escaping.** bollard pastes the reference into the path unescaped and
//!   then normalises dot segments, so `x/../other` would address container `other`.
//!   References are percent-escaped before they reach bollard (`we/ird name` →
//!   `we%2Fird%20name`), as Go's `url.PathEscape` does in the fork.
//!
//! Redirects are never followed: bollard's hyper client has no redirect support, and any
//! status other than 2xx/304 comes back as an error (a 301 maps to `Daemon`). That matters:
//! Docker unescapes the path before routing and answers a non-canonical one (`x%2F..%2Fother`)
//! with a 301 to the cleaned path, which a following client would then act on.

use std::fmt::Write as _;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::query_parameters::StopContainerOptionsBuilder;
use hyper::http::uri::{PathAndQuery, Uri};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{ContainerInfo, ContainerLifecycle, LifecycleError, LifecycleFuture, ListedContainer};

/// Client timeout for start, inspect and version negotiation.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Docker's SIGKILL lands this long before the stop budget ends, leaving time for the
/// daemon to reap the container and answer before our caller gives up.
const KILL_MARGIN: Duration = Duration::from_secs(5);

/// Extra time a stop request may take beyond its budget: covers the minimum `t` of one
/// second when the budget is shorter than that, plus the daemon's teardown after SIGKILL.
const STOP_SLACK: Duration = Duration::from_secs(2);

/// Budgets beyond this are treated as this, so deadline arithmetic cannot overflow.
const MAX_BUDGET: Duration = Duration::from_secs(24 * 60 * 60);

/// Used while negotiation keeps failing: the version of the engines this proxy has
/// been verified against, and the fork's fallback.
const FALLBACK_VERSION: ApiVersion = ApiVersion {
    major: 1,
    minor: 41,
};

/// Docker error bodies can travel to an operator's terminal over the control socket.
const MAX_BODY_BYTES: usize = 4096;

/// Starts, stops and inspects containers through the Docker Engine API.
#[derive(Debug)]
pub struct DockerLifecycle {
    socket: PathBuf,
    /// Unversioned, as bollard builds it; each call gets a clone with its own version
    /// prefix and timeout.
    client: Docker,
    /// Holds only a successful negotiation; a failure leaves it empty, so the next call
    /// tries again.
    version: OnceCell<ApiVersion>,
}

/// Checks `--docker-socket` at boot, so a typo is a startup error rather than a failed
/// wake hours later.
///
/// # Errors
///
/// `docker socket <path> does not exist`, `docker socket <path> is not a unix socket`, or
/// the I/O error that kept the path from being checked.
pub fn check_socket_path(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => Ok(()),
        Ok(_) => Err(format!(
            "docker socket {} is not a unix socket",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("docker socket {} does not exist", path.display()))
        }
        Err(e) => Err(format!("docker socket {}: {e}", path.display())),
    }
}

/// Builds a client for the socket at `path`. Nothing is sent until the first call.
///
/// # Errors
///
/// When the path does not exist (bollard checks) or is not valid UTF-8.
pub fn connect(path: &Path) -> Result<DockerLifecycle, String> {
    let display = path.display();
    let path_str = path
        .to_str()
        .ok_or_else(|| format!("docker socket {display} is not valid UTF-8"))?;
    // The client's own timeout only bounds waiting for response headers; ours (see
    // `DockerLifecycle::run`) bounds the whole call and always fires first.
    let client = Docker::connect_with_unix(
        path_str,
        backstop_secs(MAX_BUDGET),
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|e| match e {
        BollardError::SocketNotFoundError(_) => format!("docker socket {display} does not exist"),
        other => format!("docker socket {display}: {}", error_chain(&other)),
    })?;
    Ok(DockerLifecycle {
        socket: path.to_owned(),
        client,
        version: OnceCell::new(),
    })
}

impl DockerLifecycle {
    /// Negotiates on first use: the engine's newest version, capped at the newest bollard's
    /// models understand. A failure is not cached; that call uses [`FALLBACK_VERSION`].
    async fn api_version(&self) -> ApiVersion {
        let negotiated = self
            .version
            .get_or_try_init(|| async {
                let reported = self.client.version().await.map_err(|e| error_chain(&e))?;
                let server = reported
                    .api_version
                    .as_deref()
                    .and_then(ApiVersion::parse)
                    .ok_or_else(|| "no parseable ApiVersion in /version".to_owned())?;
                Ok::<_, String>(server.min(ApiVersion::from(bollard::API_DEFAULT_VERSION)))
            })
            .await;
        match negotiated {
            Ok(version) => *version,
            Err(e) => {
                tracing::debug!(
                    socket = %self.socket.display(),
                    error = %e,
                    "docker API version negotiation failed, using {FALLBACK_VERSION}"
                );
                FALLBACK_VERSION
            }
        }
    }

    /// Runs one container call under `limit` (negotiation included) and maps its error.
    /// `call` gets a client that sends versioned paths.
    async fn run<T, F, Fut>(
        &self,
        container: &str,
        limit: Duration,
        call: F,
    ) -> Result<T, LifecycleError>
    where
        F: FnOnce(Docker) -> Fut,
        Fut: Future<Output = Result<T, BollardError>>,
    {
        let work = async {
            let version = self.api_version().await;
            let client = self
                .client
                .clone()
                .with_timeout(Duration::from_secs(backstop_secs(limit)))
                .with_request_modifier(move |mut request| {
                    if let Some(versioned) = version.prefix(request.uri()) {
                        *request.uri_mut() = versioned;
                    }
                    request
                });
            call(client).await.map_err(|e| self.map_error(container, e))
        };
        match tokio::time::timeout(limit, work).await {
            Ok(result) => result,
            Err(_) => Err(LifecycleError::Timeout(container.to_owned())),
        }
    }

    fn map_error(&self, container: &str, error: BollardError) -> LifecycleError {
        match error {
            BollardError::DockerResponseServerError {
                status_code: 404, ..
            } => LifecycleError::NotFound(container.to_owned()),
            BollardError::DockerResponseServerError {
                status_code: 403, ..
            } => LifecycleError::Forbidden(container.to_owned()),
            // bollard has already pulled `message` out of Docker's JSON error body, or
            // kept the raw body when it was not JSON.
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } => LifecycleError::Daemon {
                container: container.to_owned(),
                status: status_code,
                body: truncate_body(&message),
            },
            BollardError::RequestTimeoutError => LifecycleError::Timeout(container.to_owned()),
            // Only a 2xx body that does not decode (inspect) gets here: the daemon
            // answered, but not with something we understand.
            BollardError::JsonDataError { .. } | BollardError::JsonSerdeError { .. } => {
                LifecycleError::Daemon {
                    container: container.to_owned(),
                    status: 200,
                    body: truncate_body(&format!("undecodable response: {}", error_chain(&error))),
                }
            }
            other => LifecycleError::Transport(format!(
                "{}: {}",
                self.socket.display(),
                error_chain(&other)
            )),
        }
    }
}

/// Docker refuses to start a frozen container, to thaw one that is not frozen and to
/// freeze one that is frozen already or not running, with a 409 or (20.10, for some) a
/// 500: the refusal is told apart by asking for the container's state, not by its code.
fn is_refusal(result: &Result<(), LifecycleError>) -> bool {
    matches!(result, Err(LifecycleError::Daemon { .. }))
}

impl DockerLifecycle {
    async fn start_only(&self, container: &str) -> Result<(), LifecycleError> {
        let reference = escape_reference(container)?;
        // bollard counts 304 (already running) as success.
        self.run(container, CALL_TIMEOUT, |docker| async move {
            docker.start_container(&reference, None).await
        })
        .await
    }

    async fn unpause_only(&self, container: &str) -> Result<(), LifecycleError> {
        let reference = escape_reference(container)?;
        self.run(container, CALL_TIMEOUT, |docker| async move {
            docker.unpause_container(&reference).await
        })
        .await
    }
}

impl ContainerLifecycle for DockerLifecycle {
    fn start<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
        Box::pin(async move {
            // Docker refuses to start a frozen container: thaw it instead, so a wake after
            // a restart or a redeploy mid-freeze still brings it back.
            let started = self.start_only(container).await;
            if is_refusal(&started) && self.inspect(container).await.is_ok_and(|i| i.paused) {
                return self.unpause_only(container).await;
            }
            started
        })
    }

    fn freeze<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
        Box::pin(async move {
            let reference = escape_reference(container)?;
            let frozen = self
                .run(container, CALL_TIMEOUT, |docker| async move {
                    docker.pause_container(&reference).await
                })
                .await;
            // Refused because it is frozen already or not running: either way it uses
            // no CPU, which is what a freeze is for.
            if is_refusal(&frozen)
                && self
                    .inspect(container)
                    .await
                    .is_ok_and(|i| i.paused || !i.running)
            {
                return Ok(());
            }
            frozen
        })
    }

    fn thaw<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
        Box::pin(async move {
            // Refused because it is not frozen: a frozen service's container may have been
            // stopped since (a daemon or host restart stops frozen containers), so start
            // it; or thawed by hand, so there is nothing to do.
            let thawed = self.unpause_only(container).await;
            if is_refusal(&thawed) {
                match self.inspect(container).await {
                    Ok(i) if !i.running => return self.start_only(container).await,
                    Ok(i) if !i.paused => return Ok(()),
                    _ => {}
                }
            }
            thawed
        })
    }

    fn list<'a>(&'a self, labels: &'a [String]) -> LifecycleFuture<'a, Vec<ListedContainer>> {
        Box::pin(async move {
            let what = format!("label {}", labels.join(","));
            self.run(&what, CALL_TIMEOUT, |docker| async move {
                let filters =
                    std::collections::HashMap::from([("label".to_owned(), labels.to_vec())]);
                let options = bollard::query_parameters::ListContainersOptions {
                    all: true,
                    filters: Some(filters),
                    ..Default::default()
                };
                let listed = docker.list_containers(Some(options)).await?;
                Ok(listed
                    .into_iter()
                    .filter_map(|c| {
                        use bollard::models::ContainerSummaryStateEnum as State;
                        let live = matches!(
                            c.state,
                            Some(State::RUNNING | State::PAUSED | State::RESTARTING)
                        );
                        Some(ListedContainer {
                            id: c.id?,
                            created: c.created.unwrap_or(0),
                            live,
                        })
                    })
                    .collect())
            })
            .await
        })
    }

    fn stop<'a>(&'a self, container: &'a str, budget: Duration) -> LifecycleFuture<'a, ()> {
        Box::pin(async move {
            let reference = escape_reference(container)?;
            let budget = budget.min(MAX_BUDGET);
            let budget_ends = Instant::now() + budget;
            self.run(container, budget + STOP_SLACK, |docker| async move {
                // Measured after negotiation, which spends part of the budget.
                let t = stop_timeout_secs(budget_ends.saturating_duration_since(Instant::now()));
                let options = StopContainerOptionsBuilder::new().t(t).build();
                // bollard counts 304 (already stopped) as success.
                docker.stop_container(&reference, Some(options)).await
            })
            .await
        })
    }

    fn inspect<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ContainerInfo> {
        Box::pin(async move {
            let reference = escape_reference(container)?;
            self.run(container, CALL_TIMEOUT, |docker| async move {
                let inspected = docker.inspect_container(&reference, None).await?;
                let labels = inspected
                    .config
                    .and_then(|c| c.labels)
                    .map(|l| l.into_iter().collect())
                    .unwrap_or_default();
                let state = inspected.state.unwrap_or_default();
                Ok(ContainerInfo {
                    labels,
                    running: state.running.unwrap_or(false),
                    paused: state.paused.unwrap_or(false),
                })
            })
            .await
        })
    }
}

/// Docker's `t` for a stop that must finish within `remaining`: SIGKILL lands
/// [`KILL_MARGIN`] before the end, and never at once (`t=0` would skip SIGTERM).
fn stop_timeout_secs(remaining: Duration) -> i32 {
    let secs = remaining.saturating_sub(KILL_MARGIN).as_secs().max(1);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// bollard's own timeout, in whole seconds, set just past ours so ours decides.
fn backstop_secs(limit: Duration) -> u64 {
    limit.as_secs() + 2
}

/// Percent-escapes everything but RFC 3986 unreserved characters, so a reference stays
/// one path segment (`we/ird name` → `we%2Fird%20name`). `.` and `..` would still be
/// dot segments after escaping, and like the empty string they can never name a
/// container, so they are refused here without asking Docker.
fn escape_reference(container: &str) -> Result<String, LifecycleError> {
    if matches!(container, "" | "." | "..") {
        return Err(LifecycleError::NotFound(container.to_owned()));
    }
    let mut escaped = String::with_capacity(container.len());
    for byte in container.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            escaped.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(escaped, "%{byte:02X}");
        }
    }
    Ok(escaped)
}

/// The first [`MAX_BODY_BYTES`] of a daemon answer (cut on a character boundary), trimmed.
fn truncate_body(body: &str) -> String {
    let mut end = body.len().min(MAX_BODY_BYTES);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body[..end].trim().to_owned()
}

/// bollard's top-level messages ("error in the hyper legacy client: client error
/// (Connect)") hide the cause; the operator needs the whole chain.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ApiVersion {
    major: usize,
    minor: usize,
}

impl ApiVersion {
    fn parse(text: &str) -> Option<Self> {
        let (major, minor) = text.trim().split_once('.')?;
        Some(Self {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }

    /// `unix://…/containers/x/start?t=1` → `unix://…/v1.41/containers/x/start?t=1`.
    /// `None` leaves the request as bollard built it (unversioned, still served).
    fn prefix(self, uri: &Uri) -> Option<Uri> {
        let path = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(PathAndQuery::try_from(format!("/v{self}{path}")).ok()?);
        Uri::from_parts(parts).ok()
    }
}

impl From<&bollard::ClientVersion> for ApiVersion {
    fn from(version: &bollard::ClientVersion) -> Self {
        Self {
            major: version.major_version,
            minor: version.minor_version,
        }
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_timeout_lands_the_kill_inside_the_budget() {
        assert_eq!(stop_timeout_secs(Duration::from_secs(30)), 25);
        assert_eq!(stop_timeout_secs(Duration::from_millis(29_999)), 24);
        assert_eq!(stop_timeout_secs(Duration::from_secs(7)), 2);
        assert_eq!(stop_timeout_secs(Duration::from_millis(6_500)), 1);
        // Never 0: that would SIGKILL without a SIGTERM first.
        assert_eq!(stop_timeout_secs(Duration::from_secs(5)), 1);
        assert_eq!(stop_timeout_secs(Duration::ZERO), 1);
        assert_eq!(stop_timeout_secs(Duration::MAX), i32::MAX);
    }

    #[test]
    fn references_stay_one_path_segment() {
        assert_eq!(escape_reference("app-web_1.x~").unwrap(), "app-web_1.x~");
        assert_eq!(escape_reference("we/ird name").unwrap(), "we%2Fird%20name");
        assert_eq!(escape_reference("a?b#c%").unwrap(), "a%3Fb%23c%25");
        assert_eq!(escape_reference("é").unwrap(), "%C3%A9");
        for unusable in ["", ".", ".."] {
            assert_eq!(
                escape_reference(unusable),
                Err(LifecycleError::NotFound(unusable.to_owned()))
            );
        }
    }

    #[test]
    fn bodies_are_cut_on_a_char_boundary_and_trimmed() {
        assert_eq!(truncate_body("  no such thing \n"), "no such thing");
        let long = "é".repeat(3000); // 6000 bytes, 2 per char
        let cut = truncate_body(&long);
        assert_eq!(cut.len(), MAX_BODY_BYTES);
        let odd = format!("x{long}");
        assert_eq!(truncate_body(&odd).len(), MAX_BODY_BYTES - 1);
    }

    #[test]
    fn versions_parse_compare_and_prefix_paths() {
        assert_eq!(
            ApiVersion::parse("1.41"),
            Some(ApiVersion {
                major: 1,
                minor: 41
            })
        );
        assert_eq!(ApiVersion::parse("1.x"), None);
        assert_eq!(ApiVersion::parse(""), None);
        assert!(ApiVersion::parse("1.9") < ApiVersion::parse("1.41"));
        let uri: Uri = "unix://2f72756e/containers/x/stop?t=1".parse().unwrap();
        let prefixed = FALLBACK_VERSION.prefix(&uri).unwrap();
        assert_eq!(
            prefixed.to_string(),
            "unix://2f72756e/v1.41/containers/x/stop?t=1"
        );
    }

    #[test]
    fn socket_path_check_names_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.sock");
        assert_eq!(
            check_socket_path(&missing),
            Err(format!(
                "docker socket {} does not exist",
                missing.display()
            ))
        );
        assert_eq!(
            check_socket_path(dir.path()),
            Err(format!(
                "docker socket {} is not a unix socket",
                dir.path().display()
            ))
        );
        let socket = dir.path().join("ok.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert_eq!(check_socket_path(&socket), Ok(()));
    }
}
