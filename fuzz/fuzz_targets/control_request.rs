//! The control protocol: the server's request decoder, the deploy checks and service
//! build behind it, and the CLI's response decoder.
#![no_main]

use kamal_proxy::balancer::target::validate_target;
use kamal_proxy::control::{Request, Response};
use kamal_proxy::options::validate_service_name;
use kamal_proxy::service::ServiceConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<Response>(data);
    let Ok(Request::Deploy(args)) = Request::decode(data) else {
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
});
