use super::*;

#[test]
fn leftover_temp_files_of_dead_writers_go() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("kamal-proxy.state");
    let dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    let mut dead = dead;
    dead.wait().unwrap();
    let live = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let names = [
        format!("kamal-proxy.state.tmp-{dead_pid}"),
        format!("kamal-proxy.state.tmp-{}", live.id()),
        format!("kamal-proxy.state.tmp-{}", std::process::id()),
        "kamal-proxy.state.tmp-notapid".to_string(),
        format!("other.state.tmp-{dead_pid}"),
    ];
    for n in &names {
        std::fs::write(dir.path().join(n), b"[]").unwrap();
    }
    let removed = remove_stale_temp_files(&state);
    let mut live = live;
    let _ = live.kill();
    let _ = live.wait();
    assert_eq!(removed, vec![dir.path().join(&names[0])]);
    for n in &names[1..] {
        assert!(dir.path().join(n).exists(), "{n} kept");
    }
}

#[test]
fn loads_upstream_array_and_legacy_keys() {
    let json = br#"[{"name":"app","hosts":["a.com"],"active_target":"web:3000","options":{"tls_redirect":true},"target_options":{"response_timeout":3000000000}}]"#;
    let s = parse(json).unwrap();
    assert_eq!(s[0].active_targets, vec!["web:3000"]);
    assert_eq!(s[0].options.hosts, vec!["a.com"]);
    assert_eq!(s[0].options.path_prefixes, vec!["/"]);
    assert_eq!(
        s[0].target_options.response_timeout,
        crate::gotime::GoDuration::from_secs(3)
    );
}

#[test]
fn roundtrips_and_refuses_future_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kamal-proxy.state");
    let svc = parse(br#"[{"name":"a","active_targets":["web:1"]}]"#).unwrap();
    save(&path, &svc).unwrap();
    let back = load(&path).unwrap().unwrap();
    assert_eq!(back, svc);
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("[{\"name\":\"a\","),
        "upstream's top-level array"
    );
    // What our 0.x releases wrote still loads.
    let wrapped = br#"{"version":2,"services":[{"name":"a","active_targets":["web:1"]}]}"#;
    assert_eq!(parse(wrapped).unwrap(), svc);
    assert!(matches!(
        parse(br#"{"version":99,"services":[]}"#),
        Err(LoadError::Corrupt(_))
    ));
    assert!(matches!(parse(b"{not json"), Err(LoadError::Corrupt(_))));
    assert!(load(&dir.path().join("missing")).unwrap().is_none());
}

#[test]
fn an_impossible_target_makes_the_whole_file_corrupt() {
    let json =
        br#"[{"name":"ok","active_targets":["web:80"]},{"name":"bad","active_target":"foo/bar"}]"#;
    match parse(json) {
        Err(LoadError::Corrupt(e)) => {
            assert_eq!(e, "service \"bad\": foo/bar :invalid host pattern")
        }
        other => panic!("expected corrupt, got {other:?}"),
    }
}

#[test]
fn weights_are_kept_beside_upstream_s_lists() {
    // Ours: plain addresses in upstream's lists, the weights in our keys.
    let ours = br#"[{"name":"app","active_targets":["web-1:80","web-2:80"],"active_target_weights":[1,5],"rollout_targets":["new:80"],"rollout_readers":["replica:80"],"rollout_reader_weights":[7]}]"#;
    let s = parse(ours).unwrap();
    let (writers, readers) = s[0].active_specs();
    let shown = |v: &[TargetSpec]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(shown(&writers), ["web-1:80", "web-2:80;weight=5"]);
    assert!(readers.is_empty());
    let (writers, readers) = s[0].rollout_specs();
    assert_eq!(shown(&writers), ["new:80"]);
    assert_eq!(shown(&readers), ["replica:80;weight=7"]);

    // The Go fork's: weights inside the lists. They load, and move to our keys.
    let fork = br#"[{"name":"app","active_targets":["web-1:80","web-2:80;weight=5"],"active_readers":["replica:80;weight=2"],"rollout_targets":["new:80;weight=3"]}]"#;
    let s = parse(fork).unwrap();
    assert_eq!(s[0].active_targets, ["web-1:80", "web-2:80"]);
    assert_eq!(s[0].active_target_weights, [1, 5]);
    assert_eq!(s[0].active_readers, ["replica:80"]);
    assert_eq!(s[0].active_reader_weights, [2]);
    assert_eq!(
        s[0].rollout_targets.as_deref(),
        Some(&["new:80".to_string()][..])
    );
    assert_eq!(s[0].rollout_target_weights, [3]);
    let saved = serde_json::to_value(&s).unwrap();
    assert_eq!(
        saved[0]["active_targets"],
        serde_json::json!(["web-1:80", "web-2:80"])
    );

    // Weights that do not fit their list make the file corrupt, as a bad target does.
    for (bad, why) in [
        (
            r#"[{"name":"app","active_targets":["web:80"],"active_target_weights":[1,2]}]"#,
            "service \"app\": 2 weights for the 1 entries of active_targets",
        ),
        (
            r#"[{"name":"app","active_targets":["web:80","web2:80"],"active_target_weights":[0,2]}]"#,
            "service \"app\": invalid target weight: 0 is outside 1-1000",
        ),
        (
            r#"[{"name":"app","active_targets":["web:80;weight=x"]}]"#,
            "service \"app\": invalid target weight: 'x' is not a whole number",
        ),
    ] {
        match parse(bad.as_bytes()) {
            Err(LoadError::Corrupt(e)) => assert_eq!(e, why),
            other => panic!("expected corrupt, got {other:?}"),
        }
    }
}

#[test]
fn the_session_affinity_key_round_trips() {
    let key = PinKey::generate().unwrap();
    let json = format!(
        r#"[{{"name":"app","active_targets":["web:80"],"session_affinity_key":{}}}]"#,
        serde_json::to_string(&key).unwrap()
    );
    let s = parse(json.as_bytes()).unwrap();
    assert_eq!(s[0].session_affinity_key.as_ref(), Some(&key));
    let bad = br#"[{"name":"app","active_targets":["web:80"],"session_affinity_key":"nope"}]"#;
    assert!(matches!(parse(bad), Err(LoadError::Corrupt(_))));
}

#[test]
fn set_aside_never_replaces_an_earlier_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kamal-proxy.state");
    std::fs::write(&path, "one").unwrap();
    let first = set_aside(&path).unwrap();
    std::fs::write(&path, "two").unwrap();
    let second = set_aside(&path).unwrap();
    assert_ne!(first, second);
    assert_eq!(std::fs::read_to_string(first).unwrap(), "one");
    assert_eq!(std::fs::read_to_string(second).unwrap(), "two");
}
