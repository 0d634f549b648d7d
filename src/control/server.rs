//! The server side of the control socket: one task per connection, so a long deploy does
//! not hold up `list` or another service's deploy.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::{Request, Response};
use crate::router::Router;

/// Requests are small; anything larger is not from our CLI.
const MAX_REQUEST_BYTES: u64 = 4 << 20;

/// How long a caller may take to send its request. There is no deadline on the reply: a
/// deploy legitimately waits for health checks and a drain.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);

pub struct ControlListener {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlListener {
    /// Replaces a stale socket file left by a previous run, as upstream does.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        // Whatever the umask: only the server's own user (and root) may connect. Callers
        // are checked again by their credentials, which also closes the window before
        // this chmod.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(ControlListener {
            listener,
            path: path.to_path_buf(),
        })
    }

    pub async fn serve(self, router: Arc<Router>) {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    let router = router.clone();
                    tokio::spawn(async move { handle(stream, router).await });
                }
                Err(e) => {
                    tracing::error!(error = %e, "Failed to accept control connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn handle(mut stream: UnixStream, router: Arc<Router>) {
    let caller = stream.peer_cred().map(|c| c.uid());
    // The request is read even from a caller that will be refused: closing with its bytes
    // unread would reset the connection, and the caller would never see why.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(
        REQUEST_READ_TIMEOUT,
        (&mut stream).take(MAX_REQUEST_BYTES).read_to_end(&mut buf),
    )
    .await;
    let admitted = caller
        .map_err(|e| e.to_string())
        .and_then(|uid| admit(uid, server_uid()));
    let response = match (admitted, read) {
        (Err(refusal), _) => {
            tracing::warn!(reason = %refusal, "Refused control connection");
            Response::Error(refusal)
        }
        (Ok(()), Err(_)) => Response::Error("timed out reading the request".into()),
        (Ok(()), Ok(Err(e))) => Response::Error(format!("failed to read request: {e}")),
        (Ok(()), Ok(Ok(_))) => match Request::decode(&buf) {
            Err(e) => Response::Error(e),
            Ok(request) => dispatch(&router, request).await,
        },
    };
    reply(&mut stream, &response).await;
}

async fn reply(stream: &mut UnixStream, response: &Response) {
    if let Ok(body) = serde_json::to_vec(response) {
        let _ = stream.write_all(&body).await;
    }
    let _ = stream.shutdown().await;
}

fn server_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Only root and the server's own user may change what the proxy serves.
fn admit(caller: u32, server: u32) -> Result<(), String> {
    if caller == 0 || caller == server {
        Ok(())
    } else {
        Err(format!(
            "permission denied: uid {caller} may not control this kamal-proxy (it runs as uid {server}; use that user or root)"
        ))
    }
}

async fn dispatch(router: &Arc<Router>, request: Request) -> Response {
    let result = match request {
        Request::Deploy(args) => router.deploy(*args).await,
        Request::Remove { service } => router.remove(&service).await,
        Request::Pause {
            service,
            drain_timeout,
            pause_timeout,
        } => router.pause(&service, drain_timeout, pause_timeout).await,
        Request::Stop {
            service,
            drain_timeout,
            message,
        } => router.stop(&service, drain_timeout, message).await,
        Request::Resume { service } => router.resume(&service).await,
        Request::List => return Response::List(super::list::describe(router.services())),
        Request::RolloutDeploy(args) => router.rollout_deploy(args).await,
        Request::RolloutSet {
            service,
            percentage,
            allowlist,
        } => router.rollout_set(&service, percentage, allowlist).await,
        Request::RolloutStop { service } => router.rollout_stop(&service).await,
    };
    match result {
        Ok(()) => Response::Ok,
        Err(e) => Response::Error(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_the_server_s_user_are_admitted() {
        assert!(admit(0, 1001).is_ok());
        assert!(admit(1001, 1001).is_ok());
        let refused = admit(65534, 1001).unwrap_err();
        assert!(refused.contains("uid 65534"), "{refused}");
    }
}
