//! The README's container upgrade recipe, replayed line by line on the real engine with the
//! image `scripts/image` builds: a `hold` container owns the network namespace and the
//! published ports, proxy generations join it with `--network container:…`, and the new
//! generation takes the listening sockets over from the old one through the data volume
//! while fresh connections keep arriving. Nothing may fail.

use std::time::Duration;
use testkit::docker;
use testkit::kamal::{self, CONFIG_DIR, Deploy, KamalHost};
use testkit::load::Load;

const APP_HOST: &str = "app.example.com";
/// Generous: a container start on a loaded CI machine; never an assertion on speed.
const PATIENCE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn the_hold_recipe_upgrades_the_proxy_container_without_failing_a_request() {
    if !docker::require_docker() {
        return;
    }
    let mut host = KamalHost::new(&[]);
    let image = kamal::image();
    let label = docker::TEST_LABEL;
    let holder = format!("{}-hold", host.proxy);
    let old = format!("{}-old", host.proxy);
    host.remove_on_drop(&holder);
    host.remove_on_drop(&old);

    // Once: the holder, never restarted by an upgrade, on host ports the engine picks.
    host.run_ok(&format!(
        "docker run -d --name {holder} --network {net} --restart unless-stopped --label {label} \
         --publish 127.0.0.1::80 --publish 127.0.0.1::443 {image} kamal-proxy hold",
        net = host.network,
    ));
    host.learn_ports(&holder);
    // A generation: the image's `run --reuse-port` in the holder's namespace, on the volume.
    let generation = || {
        format!(
            "docker run -d --name {proxy} --network container:{holder} --restart unless-stopped \
             --label {label} \
             --volume {volume}:{CONFIG_DIR} {image} kamal-proxy run --reuse-port",
            proxy = host.proxy,
            volume = host.volume,
        )
    };
    host.run_ok(&generation());
    host.wait_until_serving().await;
    let app = host.app("app-web", "v1", "web-v1", &[]);
    host.deploy(&Deploy::new("app-web", &app.target(), APP_HOST));

    let load = Load::start(host.http_port, APP_HOST, "web-v1", 8);
    load.wait_for_more(200).await;

    // Each upgrade, as the README writes it.
    host.run_ok(&format!("docker rename {} {old}", host.proxy));
    host.run_ok(&format!("docker update --restart no {old}"));
    host.run_ok(&generation());
    host.wait_for_log(&["Took over the listeners"], PATIENCE)
        .await;
    load.wait_for_more(200).await;
    host.run_ok(&format!(
        "docker exec {old} kamal-proxy drain --drain-timeout=30s"
    ));
    host.wait_for_container_status(&old, "exited", PATIENCE)
        .await;
    let exit = host.inspect(&old, "{{.State.ExitCode}}");
    assert_eq!(exit, "0", "the drained generation exits 0");
    host.run_ok(&format!("docker rm {old}"));
    load.wait_for_more(300).await;

    let outcome = load.finish().await;
    eprintln!(
        "hold recipe upgrade under load: {} requests, {} failed, longest {} ms",
        outcome.ok + outcome.failures.len() as u64,
        outcome.failures.len(),
        outcome.longest.as_millis()
    );
    assert_eq!(outcome.failures, Vec::<String>::new(), "{}", host.logs());

    // `docker exec kamal-proxy` reaches the new generation, which owns the state: it lists
    // the service it restored and takes a deploy.
    let list = host.list_json();
    assert_eq!(list["services"]["app-web"]["host"], APP_HOST, "{list}");
    let api = host.app("app-api", "v1", "api-v1", &[]);
    host.deploy(&Deploy::new("app-api", &api.target(), "api.example.com"));
    let r = testkit::send(
        &testkit::client(),
        reqwest::Method::GET,
        &host.url("/"),
        Some("api.example.com"),
    )
    .await
    .expect("GET through the new generation");
    assert_eq!((r.status, r.body.trim()), (200, "api-v1"));
}
