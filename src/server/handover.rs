//! Seamless upgrade (fork F28, done as HAProxy's seamless reload): the next proxy
//! generation asks this one for its listening sockets and gets the very same sockets,
//! passed over a Unix socket with `SCM_RIGHTS`.
//!
//! Why not `SO_REUSEPORT` alone: each reuse-port socket has its own accept queue, and
//! when the old generation closes its socket the kernel resets every connection still
//! queued there (measured on Linux 6.18 with `net.ipv4.tcp_migrate_req=0`, the default:
//! 93 of 200 queued connections reset). A handed-over socket is one queue that both
//! generations accept from; the old one stops accepting and closes its copy, the socket
//! stays open in the new one, and no connection is lost.
//!
//! The socket lives in the data directory ([`crate::config::HANDOVER_SOCKET_NAME`]):
//! that is the volume two generations in two containers share. Handing over also hands
//! over the state file: the old generation retires it (refusing changes from then on)
//! before the new one restores from it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, UnixListener, UnixStream};

use super::Shutdown;
use crate::router::Router;

const ASK: &[u8] = b"listeners\n";
/// A generation that does not answer in this long is not going to.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Which listener a socket is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Http,
    Https,
    Metrics,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Offered {
    role: Role,
    port: u16,
}

/// Listening sockets received from the previous generation.
#[derive(Default)]
pub struct Inherited {
    sockets: Vec<(Role, u16, OwnedFd)>,
}

impl Inherited {
    /// The inherited listener for `role`, if it is on the port this generation wants.
    pub fn take(&mut self, role: Role, port: u16) -> Option<TcpListener> {
        let at = self
            .sockets
            .iter()
            .position(|(r, p, _)| *r == role && *p == port)?;
        let (_, _, fd) = self.sockets.remove(at);
        let std = std::net::TcpListener::from(fd);
        std.set_nonblocking(true).ok()?;
        TcpListener::from_std(std).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }
}

/// Asks the generation listening at `path` for its sockets. `Ok(None)` when no
/// generation is there (no socket file, or nobody behind it).
pub async fn ask(path: &Path) -> Result<Option<Inherited>, String> {
    let mut stream = match UnixStream::connect(path).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(format!("cannot reach {}: {e}", path.display())),
    };
    let failed = |e: std::io::Error| {
        format!(
            "the previous generation at {} did not hand its listeners over: {e}",
            path.display()
        )
    };
    stream.write_all(ASK).await.map_err(failed)?;
    let received = tokio::time::timeout(ANSWER_TIMEOUT, receive(&stream))
        .await
        .map_err(|_| failed(std::io::ErrorKind::TimedOut.into()))?
        .map_err(failed)?;
    Ok(Some(received))
}

async fn receive(stream: &UnixStream) -> std::io::Result<Inherited> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || recv_fds(stream.as_raw_fd())) {
            Ok((payload, fds)) => {
                if let Ok(text) = std::str::from_utf8(&payload)
                    && text.starts_with("error:")
                {
                    return Err(std::io::Error::other(text.to_string()));
                }
                let offered: Vec<Offered> =
                    serde_json::from_slice(&payload).map_err(std::io::Error::other)?;
                if offered.len() != fds.len() {
                    return Err(std::io::Error::other("sockets and their names differ"));
                }
                let sockets = offered
                    .into_iter()
                    .zip(fds)
                    .map(|(o, fd)| (o.role, o.port, fd))
                    .collect();
                return Ok(Inherited { sockets });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// One `recvmsg` with room for the three listeners (HTTP, HTTPS, metrics) and more.
fn recv_fds(fd: RawFd) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = [0u8; 1024];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: fd is a connected Unix socket; msg points at live buffers.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled in.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let first = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(first.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 && fds.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok((data[..n as usize].to_vec(), fds))
}

fn send_fds(fd: RawFd, payload: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let mut control = [0u64; 16];
    // SAFETY: as in `recv_fds`; the control buffer (128 bytes) holds up to 26 descriptors.
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize;
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg) as *mut RawFd,
                fds.len(),
            );
        }
        if libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// This generation's side: answers the next generation with its listening sockets.
pub struct HandoverListener {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's inode, so that this generation, exiting, removes its own file
    /// and never the one the next generation has bound at the same path since.
    inode: u64,
    sockets: Vec<(Role, u16, OwnedFd)>,
}

impl HandoverListener {
    /// Binds at `path` (replacing the previous generation's file: the newest generation
    /// is the one the next will ask). `listeners` are duplicated, not taken.
    pub fn bind(path: &Path, listeners: &[(Role, &TcpListener)]) -> Result<Self, String> {
        let failed = |e: std::io::Error| format!("listen unix {}: {e}", path.display());
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(e)),
        }
        let listener = UnixListener::bind(path).map_err(failed)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
        let inode = std::fs::metadata(path).map_err(failed)?.ino();
        let mut sockets = Vec::new();
        for (role, l) in listeners {
            let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
            let fd = socket2_dup(l).map_err(failed)?;
            sockets.push((*role, port, fd));
        }
        Ok(HandoverListener {
            listener,
            path: path.to_path_buf(),
            inode,
            sockets,
        })
    }

    /// Answers until the shutdown begins (a stopping generation has nothing to give).
    pub async fn serve(self, router: Arc<Router>, shutdown: Arc<Shutdown>) {
        let stop = shutdown.stopping();
        loop {
            let stream = tokio::select! {
                a = self.listener.accept() => match a {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::error!(error = %e, "Failed to accept hand-over connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = stop.cancelled() => return,
            };
            self.answer(stream, &router).await;
        }
    }

    async fn answer(&self, mut stream: UnixStream, router: &Router) {
        let caller = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let mut ask = [0u8; ASK.len()];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut ask)).await;
        if caller != 0 && caller != me {
            tracing::warn!(uid = caller, "Refused hand-over to another user");
            let _ = stream.write_all(b"error: permission denied").await;
            return;
        }
        if !matches!(read, Ok(Ok(_))) || ask != ASK {
            return;
        }
        // The state first: a change under way is saved, every later one refused, and
        // only then may the new generation read the file.
        router.retire().await;
        let offered: Vec<Offered> = self
            .sockets
            .iter()
            .map(|(role, port, _)| Offered {
                role: *role,
                port: *port,
            })
            .collect();
        let payload = serde_json::to_vec(&offered).unwrap_or_default();
        let fds: Vec<RawFd> = self
            .sockets
            .iter()
            .map(|(_, _, fd)| fd.as_raw_fd())
            .collect();
        let sent = loop {
            if let Err(e) = stream.writable().await {
                break Err(e);
            }
            match stream.try_io(Interest::WRITABLE, || {
                send_fds(stream.as_raw_fd(), &payload, &fds)
            }) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                other => break other,
            }
        };
        match sent {
            Ok(()) => tracing::info!(
                sockets = fds.len(),
                "Handed the listeners and the state file to a new generation; drain this one to finish the upgrade"
            ),
            Err(e) => tracing::error!(error = %e, "Failed to hand the listeners over"),
        }
    }
}

fn socket2_dup(l: &TcpListener) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsFd;
    l.as_fd().try_clone_to_owned()
}

impl Drop for HandoverListener {
    fn drop(&mut self) {
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_generation_to_ask_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ask(&dir.path().join("none.sock")).await.unwrap().is_none());
    }
}
