//! The test backend as a standalone program, so Docker tests can run a real app inside a
//! container: `test_backend --listen 127.0.0.1:3000 [--name app] [--boot-delay-ms 300]`.
//! `--boot-delay-ms` models an app that takes time to boot before it listens.

use testkit::backend;

use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut listen = "127.0.0.1:3000".to_string();
    let mut name = "app".to_string();
    let mut boot_delay = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_default();
        match arg.as_str() {
            "--listen" => listen = value,
            "--name" => name = value,
            "--boot-delay-ms" => boot_delay = value.parse().unwrap_or(0),
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(boot_delay)).await;
    let backend = backend::Backend::start_on(&listen, &name).await;
    eprintln!("listening on {}", backend.addr);
    std::future::pending::<()>().await;
}
