//! The control protocol: what the CLI sends decodes to the same request, what the server
//! answers decodes to the same response, and no bytes panic the decoder or the deploy
//! checks and service build that follow it.

use kamal_proxy::balancer::target::validate_target;
use kamal_proxy::control::{
    DeployArgs, ListResponse, Request, Response, RolloutDeployArgs, ServiceDescription,
};
use kamal_proxy::gotime::GoDuration;
use kamal_proxy::options::{DeploymentOptions, validate_service_name};
use kamal_proxy::service::ServiceConfig;
use proptest::prelude::*;

use crate::state::{json_value, replace_somewhere, service_options, target_options};

fn deploy() -> impl Strategy<Value = DeployArgs> {
    (
        ".{0,12}",
        prop::collection::vec(".{0,12}", 0..3),
        prop::collection::vec(".{0,12}", 0..2),
        (any::<i64>(), any::<i64>(), any::<bool>()),
        service_options(),
        target_options(),
        prop::collection::vec("[a-z-]{1,15}", 0..3),
    )
        .prop_map(
            |(
                service,
                targets,
                readers,
                (deploy, drain, force),
                service_options,
                target_options,
                sleep_flags,
            )| DeployArgs {
                service,
                targets,
                readers,
                deployment: DeploymentOptions {
                    deploy_timeout: GoDuration::from_nanos(deploy),
                    drain_timeout: GoDuration::from_nanos(drain),
                    force,
                },
                service_options,
                target_options,
                sleep_flags,
            },
        )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        deploy().prop_map(|d| Request::Deploy(Box::new(d))),
        ".{0,12}".prop_map(|service| Request::Remove { service }),
        (".{0,12}", any::<i64>(), any::<i64>()).prop_map(|(service, d, p)| Request::Pause {
            service,
            drain_timeout: GoDuration::from_nanos(d),
            pause_timeout: GoDuration::from_nanos(p),
        }),
        (".{0,12}", any::<i64>(), ".{0,20}").prop_map(|(service, d, message)| Request::Stop {
            service,
            drain_timeout: GoDuration::from_nanos(d),
            message,
        }),
        ".{0,12}".prop_map(|service| Request::Resume { service }),
        Just(Request::List),
        (
            ".{0,12}",
            prop::collection::vec(".{0,12}", 0..3),
            prop::collection::vec(".{0,12}", 0..2),
            any::<i64>(),
            any::<i64>(),
        )
            .prop_map(|(service, targets, readers, d, drain)| {
                Request::RolloutDeploy(RolloutDeployArgs {
                    service,
                    targets,
                    readers,
                    deployment: DeploymentOptions {
                        deploy_timeout: GoDuration::from_nanos(d),
                        drain_timeout: GoDuration::from_nanos(drain),
                        force: false,
                    },
                })
            }),
        (
            ".{0,12}",
            any::<i64>(),
            prop::collection::vec(".{0,8}", 0..3)
        )
            .prop_map(|(service, percentage, allowlist)| Request::RolloutSet {
                service,
                percentage,
                allowlist,
            }),
        ".{0,12}".prop_map(|service| Request::RolloutStop { service }),
        any::<i64>().prop_map(|d| Request::Drain {
            drain_timeout: GoDuration::from_nanos(d)
        }),
    ]
}

fn description() -> impl Strategy<Value = ServiceDescription> {
    (
        (".{0,8}", ".{0,8}", any::<bool>(), ".{0,8}", ".{0,8}"),
        prop::collection::vec(".{0,8}", 0..3),
        prop::collection::vec(".{0,8}", 0..3),
        (
            ".{0,8}",
            prop::collection::vec(".{0,8}", 0..2),
            prop::option::of(any::<u64>()),
        ),
        (
            prop::collection::vec(".{0,8}", 0..2),
            prop::option::of(any::<i64>()),
            prop::collection::vec(".{0,8}", 0..2),
        ),
    )
        .prop_map(
            |(
                (host, path, tls, target, state),
                hosts,
                targets,
                (sleep_state, sleep_containers, asleep_seconds),
                (rollout_targets, rollout_percentage, rollout_allowlist),
            )| ServiceDescription {
                host,
                path,
                tls,
                target,
                state,
                hosts,
                path_prefixes: vec!["/".into()],
                targets: targets.clone(),
                reader_targets: targets,
                rollout_reader_targets: rollout_targets.clone(),
                rollout_targets,
                rollout_percentage,
                rollout_allowlist,
                sleep_state,
                sleep_containers,
                asleep_seconds,
            },
        )
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        Just(Response::Ok),
        any::<String>().prop_map(Response::Error),
        prop::collection::btree_map(".{0,8}", description(), 0..3)
            .prop_map(|services| Response::List(ListResponse { services })),
    ]
}

/// The server's checks on a decoded deploy, then the service build they guard: neither
/// may panic whatever the request holds.
fn check_and_build(request: &Request) {
    let Request::Deploy(args) = request else {
        return;
    };
    let checked = validate_service_name(&args.service)
        .and_then(|()| {
            args.targets
                .iter()
                .chain(&args.readers)
                .try_for_each(|t| validate_target(t))
        })
        .and_then(|()| kamal_proxy::service::validate(&args.service_options, &args.target_options));
    if checked.is_ok() {
        let mut options = args.service_options.clone();
        options.error_page_path.clear();
        let _ = ServiceConfig::build(&args.service, options, args.target_options.clone());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::FEW))]

    /// A request the CLI encodes decodes to the same request.
    #[test]
    fn requests_round_trip(request in request()) {
        let bytes = serde_json::to_vec(&request).unwrap();
        let back = Request::decode(&bytes).map_err(TestCaseError::fail)?;
        prop_assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&request).unwrap());
        check_and_build(&back);
    }

    /// A response the server encodes decodes to the same response in the CLI.
    #[test]
    fn responses_round_trip(response in response()) {
        let bytes = serde_json::to_vec(&response).unwrap();
        let back: Response = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&response).unwrap());
    }

    /// Any bytes: a request or `invalid request: …`, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        "[{}\\[\\]\",:a-z_0-9]{0,60}".prop_map(String::into_bytes),
    ]) {
        match Request::decode(&bytes) {
            Ok(request) => check_and_build(&request),
            Err(e) => prop_assert!(e.starts_with("invalid request: "), "{}", e),
        }
    }

    /// A valid request with one value replaced by any JSON value: decoded or refused, and
    /// a decoded deploy is checked and built without a panic.
    #[test]
    fn damaged_requests_never_panic(request in request(), at in any::<prop::sample::Index>(), with in json_value()) {
        let mut value = serde_json::to_value(&request).unwrap();
        replace_somewhere(&mut value, at, with);
        if let Ok(request) = Request::decode(&serde_json::to_vec(&value).unwrap()) {
            check_and_build(&request);
        }
    }
}

/// The fuzzer's seed requests stay valid, and the deploy seed passes the server's checks.
#[test]
fn fuzz_seed_requests_decode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/control_request");
    let bytes = std::fs::read(dir.join("deploy.json")).unwrap();
    let Request::Deploy(args) = Request::decode(&bytes).unwrap() else {
        panic!("not a deploy");
    };
    kamal_proxy::service::validate(&args.service_options, &args.target_options).unwrap();
    for name in ["r0.json", "r1.json", "r2.json", "r3.json", "r4.json"] {
        Request::decode(&std::fs::read(dir.join(name)).unwrap()).unwrap();
    }
    for name in ["r5.json", "r6.json", "r7.json"] {
        serde_json::from_slice::<Response>(&std::fs::read(dir.join(name)).unwrap()).unwrap();
    }
}
