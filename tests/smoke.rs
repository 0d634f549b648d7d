use testkit::{Proxy, backend::Backend, client};

#[tokio::test(flavor = "multi_thread")]
async fn deploy_and_serve() {
    let backend = Backend::start("one").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &backend.target(), &[]).await;
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
