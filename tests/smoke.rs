mod common;
use common::{Proxy, backend::Backend, client};

#[tokio::test(flavor = "multi_thread")]
async fn deploy_and_serve() {
    let backend = Backend::start("one").await;
    let proxy = Proxy::start();
    proxy.deploy("app", &backend.target(), &[]);
    let body = client()
        .get(proxy.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "one");
}
