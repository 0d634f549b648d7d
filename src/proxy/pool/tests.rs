use super::*;

#[test]
fn errors_read_as_hyper_utils() {
    let e = UpstreamError::new("Connect", "tcp connect error".into());
    assert_eq!(e.to_string(), "client error (Connect)");
    assert_eq!(e.source().unwrap().to_string(), "tcp connect error");
    assert_eq!(connect_failure(&e), Some(ConnectFailure::Failed));
    let t = UpstreamError::new("Connect", Box::new(DialTimeout(Duration::from_millis(200))));
    assert_eq!(
        t.source().unwrap().to_string(),
        "dial timed out after 200ms"
    );
    assert_eq!(
        connect_failure(&t),
        Some(ConnectFailure::TimedOut(Duration::from_millis(200)))
    );
    let sent = UpstreamError::new("SendRequest", "connection reset".into());
    assert_eq!(connect_failure(&sent), None);
}

/// A real hyper client connection over an in-memory pipe (the far end is returned so
/// it stays open).
async fn upstream(home: usize) -> (Upstream, tokio::io::DuplexStream) {
    let (near, far) = tokio::io::duplex(1024);
    let (mut sender, connection) = http1::handshake(hyper_util::rt::TokioIo::new(near))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender.ready().await.expect("ready");
    let conn = Conn::Hyper(sender);
    (Upstream { conn, home }, far)
}

#[tokio::test]
async fn at_the_idle_limit_a_returning_connection_replaces_the_longest_idle_of_any_worker() {
    let pools = Pools::new(PoolSettings {
        max_idle: 2,
        ..PoolSettings::default()
    });
    let target = pools.target(&"127.0.0.1:1".parse().unwrap());
    let lens = |t: &TargetPool| -> Vec<usize> {
        (0..t.idle.len()).map(|i| t.lock(i).conns.len()).collect()
    };
    let (a, _a) = upstream(0).await;
    let (b, _b) = upstream(0).await;
    target.clone().put(a);
    target.clone().put(b);
    assert_eq!(lens(&target)[..2], [2, 0]);
    // Another worker's connection comes back: worker 0's oldest makes room for it,
    // instead of this one closing while worker 0's sit unused.
    let (c, _c) = upstream(1).await;
    target.clone().put(c);
    assert_eq!(lens(&target)[..2], [1, 1]);
    assert_eq!(target.idle_count.load(Ordering::Relaxed), 2);
    // Taken from its own list first, and it goes back to the list of the worker that
    // drives it whoever took it.
    let taken = target
        .take_any(Duration::from_secs(60), Kind::Hyper)
        .expect("an idle one");
    assert_eq!(target.idle_count.load(Ordering::Relaxed), 1);
    let home = taken.home;
    target.clone().put(taken);
    assert_eq!(lens(&target)[home], 1);
    assert_eq!(target.idle_count.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn a_target_pool_is_made_once_and_kept_only_while_it_has_connections() {
    let pools = Pools::new(PoolSettings::default());
    let a: Authority = "127.0.0.1:1".parse().unwrap();
    let first = pools.target(&a);
    assert!(Arc::ptr_eq(&first, &pools.target(&a)));
    let next = Pools::succeed(&pools, PoolSettings::default());
    assert!(next.targets.load().is_empty(), "no open connection to keep");
    first.open.store(1, Ordering::Release);
    let next = Pools::succeed(&pools, PoolSettings::default());
    assert!(Arc::ptr_eq(&first, &next.target(&a)));
    let other = PoolSettings {
        keep_alive: false,
        ..PoolSettings::default()
    };
    assert!(Pools::succeed(&pools, other).targets.load().is_empty());
}
