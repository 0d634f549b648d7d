//! The CLI side: connect, send one request, read one response.

use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::{Request, Response};

/// How long connecting may take; the reply has no deadline (a deploy waits for health
/// checks and a drain).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `request` to the server at `socket`. Errors are the text printed after `Error: `.
pub async fn call(socket: &Path, request: &Request) -> Result<Response, String> {
    let unreachable = |why: String| {
        format!(
            "cannot reach the kamal-proxy server at {} ({why}); is `kamal-proxy run` running?",
            socket.display()
        )
    };
    // A server that stopped accepting (a full backlog) would leave connect waiting.
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(socket)).await;
    let mut stream = match stream {
        Err(_) => return Err(unreachable("it did not accept the connection".into())),
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Ok(Ok(s)) => s,
    };
    let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    stream.write_all(&body).await.map_err(|e| e.to_string())?;
    // Half-close marks the end of the request; the server answers and closes.
    stream.shutdown().await.map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .await
        .map_err(|e| format!("lost the connection to the server: {e}"))?;
    if reply.is_empty() {
        return Err("the server closed the connection without answering (did it stop?)".into());
    }
    serde_json::from_slice(&reply).map_err(|e| format!("invalid reply from the server: {e}"))
}
