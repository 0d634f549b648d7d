//! Scale-to-zero benchmark (run with `bash bench/wake.sh`).
//!
//! Wake latency and overhead from each tier — stopped (`--sleep-after`) and frozen
//! (`--freeze-after`, docker pause) — for the same app: time to the first response, and
//! that minus the moment the app itself first answers a direct poll in the same cycle,
//! medians over `WAKE_CYCLES` cycles (default 10), for an app that listens at once and one
//! that boots in 0.3 s, with 1, 10 and 100 concurrent first requests. The engine's own
//! start→ready (or unpause→ready) time is measured alone beside it.
//!
//! Scale: RSS and idle CPU of a proxy restored with 0, 100 and 1,000 sleeping (and 1,000
//! frozen) services, read from /proc after the restore.
//!
//! Tracking cost = requests/s through a service with sleep enabled (never idle long
//! enough to sleep) ÷ the same without, same proxy, same backend, runs interleaved.

use kamal_proxy::lifecycle::ContainerLifecycle;
use std::time::{Duration, Instant};
use testkit::docker::{self, TestContainer};
use testkit::{Proxy, client};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Engine API start (or thaw, `frozen`) → first 2xx from the app itself, polled every
/// 0.5 ms.
async fn direct_start_to_ready(
    docker: &dyn ContainerLifecycle,
    c: &TestContainer,
    cycles: usize,
    frozen: bool,
) -> Vec<f64> {
    let mut out = Vec::new();
    for _ in 0..cycles {
        if frozen {
            docker.freeze(&c.name).await.expect("freeze");
        } else {
            docker
                .stop(&c.name, Duration::from_secs(10))
                .await
                .expect("stop");
        }
        // Like a sleeping service: the container has been down for a while.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t0 = Instant::now();
        if frozen {
            docker.thaw(&c.name).await.expect("thaw");
        } else {
            docker.start(&c.name).await.expect("start");
        }
        loop {
            if let Ok((200, _)) = docker::http_get(c.port, "/up") {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "app never answered");
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        out.push(ms(t0.elapsed()));
    }
    out
}

async fn wait_asleep(p: &Proxy, c: &TestContainer, frozen: bool) {
    let state = if frozen { "frozen" } else { "sleeping" };
    p.wait_for_state("app", state, Duration::from_secs(30))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let down = if frozen { "paused" } else { "exited" };
    while docker::status(&c.name) != down {
        assert!(
            Instant::now() < deadline,
            "container still running while asleep"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// For each cycle: wait until asleep, fire `n` requests at once and, beside them, poll
/// the app directly every 0.5 ms. Overhead of that cycle = first proxied response − the
/// moment the app first answered directly, so Docker's own start-time variance (tens of
/// ms between cycles) cancels out.
struct Cycle {
    first: f64,
    all: Vec<f64>,
    app_ready: f64,
}

async fn proxied_wakes(
    p: &Proxy,
    c: &TestContainer,
    n: usize,
    cycles: usize,
    frozen: bool,
) -> Vec<Cycle> {
    let http = client();
    let mut out = Vec::new();
    for _ in 0..cycles {
        wait_asleep(p, c, frozen).await;
        let t0 = Instant::now();
        let port = c.port;
        let poller = tokio::task::spawn_blocking(move || {
            loop {
                if let Ok((200, _)) = docker::http_get(port, "/up") {
                    return ms(t0.elapsed());
                }
                if t0.elapsed() > Duration::from_secs(30) {
                    return f64::NAN;
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        let requests = (0..n).map(|i| {
            let http = http.clone();
            let url = p.url(&format!("/wake?{i}"));
            tokio::spawn(async move {
                let r = http.get(url).send().await.expect("request");
                assert_eq!(r.status(), 200);
                let _ = r.bytes().await;
                t0.elapsed()
            })
        });
        let mut times: Vec<f64> = futures_util::future::join_all(requests)
            .await
            .into_iter()
            .map(|r| ms(r.expect("task")))
            .collect();
        times.sort_by(|a, b| a.total_cmp(b));
        let app_ready = poller.await.expect("poller");
        out.push(Cycle {
            first: times[0],
            all: times,
            app_ready,
        });
    }
    out
}

/// One wrk run: (requests/s, proxy CPU µs per request). CPU comes from the proxy's
/// utime+stime in /proc, which is steadier than req/s on a shared machine.
fn wrk_run(pid: u32, port: u16, host: &str, seconds: u32) -> Option<(f64, f64)> {
    let before = cpu_seconds(pid)?;
    let out = std::process::Command::new("wrk")
        .args([
            "-t1",
            "-c32",
            &format!("-d{seconds}s"),
            "-H",
            &format!("Host: {host}"),
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .ok()?;
    let cpu = cpu_seconds(pid)? - before;
    let text = String::from_utf8_lossy(&out.stdout);
    let requests: f64 = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    Some((requests / f64::from(seconds), cpu * 1e6 / requests))
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// A state file of `n` services asleep in `state` (`sleeping` or `frozen`), each with
/// its own host and container, as a proxy that put them to sleep would have saved it.
fn sleeping_state(n: usize, state: &str) -> Vec<u8> {
    let services: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "name": format!("svc-{i}"),
                "options": {
                    "hosts": [format!("svc-{i}.test")],
                    "sleep_after": 3_600_000_000_000i64,
                    "freeze_after": if state == "frozen" { 60_000_000_000i64 } else { 0 },
                    "wake_timeout": 30_000_000_000i64,
                    "sleep_containers": [format!("app-{i}")],
                },
                "active_targets": [format!("app-{i}:80")],
                "idle_state": state,
            })
        })
        .collect();
    serde_json::to_vec(&services).unwrap_or_default()
}

/// RSS and idle CPU of a proxy restored with 0, 100 and 1,000 services asleep: no
/// container exists, and none is touched (the restore does not probe sleeping services).
async fn scale(socket: &str) -> serde_json::Value {
    let idle_secs: u64 = std::env::var("SCALE_IDLE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    println!(
        "
scale: a proxy restored with N services asleep, idle for {idle_secs} s"
    );
    println!(
        "{:>6} {:<9} {:>9} {:>13} {:>15}",
        "N", "state", "RSS_MiB", "idle_cpu_ms", "idle_cpu_%"
    );
    let mut out = Vec::new();
    for (n, state) in [
        (0, "sleeping"),
        (100, "sleeping"),
        (1000, "sleeping"),
        (1000, "frozen"),
    ] {
        let mut p = Proxy::start_with(&[socket], &[]).await;
        std::fs::write(p.state_file(), sleeping_state(n, state)).expect("state file");
        p.restart().await;
        if n > 0 {
            p.wait_for_state(&format!("svc-{}", n - 1), state, Duration::from_secs(30))
                .await;
        }
        // One request through, so the serving path's lazily built parts are counted.
        let _ = client().get(p.url("/")).send().await;
        let pid = p.pid().expect("proxy pid");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = cpu_seconds(pid).unwrap_or(f64::NAN);
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let cpu_ms = (cpu_seconds(pid).unwrap_or(f64::NAN) - before) * 1000.0;
        let rss = rss_mib(pid).unwrap_or(f64::NAN);
        let percent = cpu_ms / (idle_secs as f64 * 1000.0) * 100.0;
        println!("{n:>6} {state:<9} {rss:>9.1} {cpu_ms:>13.0} {percent:>15.3}");
        out.push(
            serde_json::json!({"services": n, "state": state, "rss_mib": rss,
            "idle_cpu_ms": cpu_ms, "idle_seconds": idle_secs, "idle_cpu_percent": percent}),
        );
    }
    serde_json::Value::Array(out)
}

fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces): utime is the 14th field.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // USER_HZ is 100 on Linux.
    Some((utime + stime) / 100.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if !docker::require_docker() {
        eprintln!("wake benchmark needs a Docker Engine");
        std::process::exit(1);
    }
    let cycles: usize = std::env::var("WAKE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let engine =
        kamal_proxy::lifecycle::docker::connect(&docker::docker_socket_path()).expect("docker");
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    let mut results = Vec::new();

    println!("wake overhead, {cycles} cycles each (ms; medians)");
    println!(
        "{:<10} {:<8} {:>5} {:>12} {:>10} {:>11} {:>10} {:>10} {:>10}",
        "app",
        "tier",
        "conc",
        "start→ready",
        "app ready",
        "first resp",
        "all resp",
        "overhead",
        "ovh (all)"
    );
    println!("start→ready: Engine API start (frozen: unpause) until the app answers, measured");
    println!("alone. The other");
    println!("columns count from the moment the requests are sent to the sleeping service;");
    println!("overhead = proxied response − the app answering a direct poll in the same cycle.");
    // WAKE_SKIP=1 measures only the tracking cost.
    let skip_wakes = std::env::var_os("WAKE_SKIP").is_some();
    let runs = [
        ("instant", Duration::ZERO, "stopped"),
        ("instant", Duration::ZERO, "frozen"),
        ("boot-0.3s", Duration::from_millis(300), "stopped"),
        ("boot-0.3s", Duration::from_millis(300), "frozen"),
    ];
    for (label, boot, tier) in if skip_wakes { &runs[..0] } else { &runs[..] } {
        let (label, tier, frozen) = (*label, *tier, *tier == "frozen");
        let c = docker::run_app_container("wake-bench", *boot);
        docker::wait_until_ready(&c).expect("app ready");
        let mut direct = direct_start_to_ready(&engine, &c, cycles, frozen).await;
        let direct_median = median(&mut direct);

        let p = Proxy::start_with(&[&socket], &[]).await;
        let target = format!("127.0.0.1:{}", c.port);
        let container = format!("--sleep-container={}", c.name);
        let after = if frozen {
            "--freeze-after=1s"
        } else {
            "--sleep-after=1s"
        };
        p.deploy("app", &target, &[after, &container]).await;
        for n in [1usize, 10, 100] {
            let cycles_out = proxied_wakes(&p, &c, n, cycles, frozen).await;
            let mut first: Vec<f64> = cycles_out.iter().map(|c| c.first).collect();
            let mut all: Vec<f64> = cycles_out
                .iter()
                .flat_map(|c| c.all.iter().copied())
                .collect();
            let mut ready: Vec<f64> = cycles_out.iter().map(|c| c.app_ready).collect();
            let mut overhead: Vec<f64> = cycles_out.iter().map(|c| c.first - c.app_ready).collect();
            let mut overhead_all: Vec<f64> = cycles_out
                .iter()
                .flat_map(|c| c.all.iter().map(move |t| t - c.app_ready))
                .collect();
            let (first_median, all_median) = (median(&mut first), median(&mut all));
            let (ready_median, overhead_median) = (median(&mut ready), median(&mut overhead));
            let overhead_all_median = median(&mut overhead_all);
            println!(
                "{label:<10} {tier:<8} {n:>5} {direct_median:>12.1} {ready_median:>10.1} {first_median:>11.1} {all_median:>10.1} {overhead_median:>10.1} {overhead_all_median:>10.1}"
            );
            results.push(serde_json::json!({
                "app": label, "tier": tier, "concurrency": n, "engine_start_to_ready_ms": direct_median,
                "app_ready_ms": ready_median, "first_response_ms": first_median,
                "all_responses_ms": all_median, "overhead_first_ms": overhead_median,
                "overhead_all_ms": overhead_all_median,
            }));
        }
    }

    // Hot-path cost of idle tracking: one proxy, two services on the same backend.
    let tracking = if std::env::var_os("TRACKING_SKIP").is_none()
        && std::process::Command::new("wrk")
            .arg("--version")
            .output()
            .is_ok()
    {
        let c = docker::run_app_container("wake-bench-track", Duration::ZERO);
        docker::wait_until_ready(&c).expect("app ready");
        let p = Proxy::start_with(&[&socket], &[]).await;
        let target = format!("127.0.0.1:{}", c.port);
        let container = format!("--sleep-container={}", c.name);
        p.deploy("plain", &target, &["--host=plain.test"]).await;
        p.deploy(
            "tracked",
            &target,
            &["--host=tracked.test", "--sleep-after=1h", &container],
        )
        .await;
        let secs: u32 = std::env::var("TRACKING_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        let pid = p.pid().expect("proxy pid");
        let (mut plain, mut tracked) = (Vec::new(), Vec::new());
        let (mut plain_cpu, mut tracked_cpu) = (Vec::new(), Vec::new());
        for round in 0..6 {
            // Alternate which goes first, so warm-up and drift favour neither.
            let order = if round % 2 == 0 {
                ["plain.test", "tracked.test"]
            } else {
                ["tracked.test", "plain.test"]
            };
            for host in order {
                if let Some((rps, cpu)) = wrk_run(pid, p.http_port, host, secs) {
                    if host == "plain.test" {
                        plain.push(rps);
                        plain_cpu.push(cpu);
                    } else {
                        tracked.push(rps);
                        tracked_cpu.push(cpu);
                    }
                }
            }
        }
        let (pm, tm) = (median(&mut plain), median(&mut tracked));
        let (pc, tc) = (median(&mut plain_cpu), median(&mut tracked_cpu));
        println!(
            "\nidle tracking: sleep disabled {pm:.0} req/s ({pc:.1} µs CPU/req), enabled {tm:.0} req/s ({tc:.1} µs CPU/req)"
        );
        println!(
            "  enabled/disabled: throughput {:.3}, CPU per request {:.3}",
            tm / pm,
            tc / pc
        );
        serde_json::json!({"disabled_rps": pm, "enabled_rps": tm, "ratio": tm / pm,
            "disabled_cpu_us_per_req": pc, "enabled_cpu_us_per_req": tc, "cpu_ratio": tc / pc})
    } else {
        println!("\nidle tracking: skipped (TRACKING_SKIP set, or wrk not installed)");
        serde_json::Value::Null
    };

    let scale = if std::env::var_os("SCALE_SKIP").is_some() {
        serde_json::Value::Null
    } else {
        scale(&socket).await
    };

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results");
    let _ = std::fs::create_dir_all(&dir);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let path = dir.join(format!("wake-{stamp}.json"));
    let json = serde_json::json!({"cycles": cycles, "wake": results, "tracking": tracking, "scale": scale});
    let _ = std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap_or_default());
    println!("\nresults: {}", path.display());
}
