//! Memory handed back to the system after a burst. glibc keeps what a burst freed in its
//! arenas (one per runtime thread) for reuse, so after 2,000 connections with large heads
//! RSS stayed at 100+ MB against an idle 12 MB. `malloc_trim(0)` releases the free pages
//! inside every arena; it runs on a blocking thread, at most once per check, when
//! connections have dropped well below their peak or resident memory has grown well past
//! what the last trim left. Before it, each worker cuts its spare future blocks and header
//! maps (kept for the requests of a busy worker: `recycle`, `proxy::header_maps`) back to
//! a few, so that their room is given back too.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::limits::ConnectionSlots;
use super::workers::Workers;

/// How often to look. A trim costs a walk of the arenas' free lists (milliseconds at
/// worst), so this bounds it to a negligible share of one core.
const CHECK_EVERY: Duration = Duration::from_secs(10);
/// Connections closed since the peak that make a burst.
const BURST_CONNECTIONS: usize = 64;
/// Resident growth since the last trim that is worth giving back.
const GROWTH_BYTES: u64 = 32 << 20;
/// Spare future blocks and header maps of each size a worker keeps once a burst is over
/// (it keeps up to 64 while busy: `recycle::KEPT`).
const SPARES_AFTER_BURST: usize = 16;

pub async fn after_bursts(slots: ConnectionSlots, workers: Workers, stop: CancellationToken) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut settled = resident_bytes();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let peak = slots.take_peak();
        let open = slots.open();
        let resident = resident_bytes();
        let burst_over = peak >= open + BURST_CONNECTIONS;
        let grown = resident.saturating_sub(settled) >= GROWTH_BYTES;
        if !burst_over && !grown {
            continue;
        }
        // The workers' spare blocks first, so that the trim gives back their room too.
        workers.on_each(shed_spares).await;
        let _ = tokio::task::spawn_blocking(release_free_memory).await;
        settled = resident_bytes();
        tracing::debug!(
            peak_connections = peak,
            open_connections = open,
            resident_before = resident,
            resident_after = settled,
            "Returned free memory to the system"
        );
    }
}

/// Runs on a worker's thread: its spare lists are its own.
fn shed_spares() {
    crate::recycle::shed(SPARES_AFTER_BURST);
    crate::proxy::header_maps::shed(SPARES_AFTER_BURST);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators (musl's) return memory as they free it.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

/// Resident set size, from `/proc/self/statm` (0 where there is none).
pub fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}
