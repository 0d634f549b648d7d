//! Scale-to-zero settings from the containers' Docker labels.
//!
//! Stock Kamal has no deploy.yml key that sends `--sleep-after`, but it can put `labels:`
//! on an app's containers. So when a deploy leaves a sleep flag unset and the proxy has a
//! Docker socket, the value comes from the label `kamal-proxy.<flag>` of the containers
//! the service stops and starts: one vocabulary with the flags, each value parsed and
//! validated exactly as the flag's, a flag always winning over its label. A redeploy to
//! containers without the labels therefore turns sleep off.

use tokio::time::Instant;

use crate::balancer::target::container_ref;
use crate::gotime;
use crate::lifecycle::{ContainerLifecycle, LifecycleError};
use crate::options::ServiceOptions;

pub const LABEL_PREFIX: &str = "kamal-proxy.";

/// Every scale-to-zero deploy flag, by name. A flag added here is also a label.
pub const SLEEP_FLAGS: &[&str] = &[
    "sleep-after",
    "wake-timeout",
    "sleep-container",
    "freeze-after",
    "sleep-label",
    "wake-page",
];

/// The label that stands in for a sleep flag.
pub fn label_for(flag: &str) -> String {
    format!("{LABEL_PREFIX}{flag}")
}

/// Sets one sleep flag's value on `options`, parsed as the flag's value is.
pub fn apply_value(options: &mut ServiceOptions, flag: &str, value: &str) -> Result<(), String> {
    match flag {
        "sleep-after" => options.sleep_after = gotime::parse_flag(value)?,
        "wake-timeout" => options.wake_timeout = gotime::parse_flag(value)?,
        // A label holds one string: several containers are comma-separated.
        "sleep-container" => options.sleep_containers = comma_list(value),
        "freeze-after" => options.freeze_after = gotime::parse_flag(value)?,
        // `kamal-proxy.sleep-label=service=app,role=web`
        "sleep-label" => options.sleep_labels = comma_list(value),
        "wake-page" => options.wake_page = crate::config::parse_go_bool(value)?,
        other => return Err(format!("unknown sleep flag \"{other}\"")),
    }
    Ok(())
}

fn comma_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

/// The sleep flags a deploy left unset: not named as given by the CLI, and at their
/// zero value (a request sent straight over the control socket names none).
pub fn unset_flags(options: &ServiceOptions, given: &[String]) -> Vec<&'static str> {
    SLEEP_FLAGS
        .iter()
        .copied()
        .filter(|flag| !given.iter().any(|g| g == flag))
        .filter(|flag| match *flag {
            "sleep-after" => options.sleep_after == Default::default(),
            "wake-timeout" => options.wake_timeout == Default::default(),
            "sleep-container" => options.sleep_containers.is_empty(),
            "freeze-after" => options.freeze_after == Default::default(),
            "sleep-label" => options.sleep_labels.is_empty(),
            "wake-page" => !options.wake_page,
            _ => true,
        })
        .collect()
}

/// The containers whose labels count: those named by `--sleep-container`, else the ones
/// the targets name (Kamal's targets are container ids), each once.
pub fn label_sources(options: &ServiceOptions, targets: &[String]) -> Vec<String> {
    if !options.sleep_containers.is_empty() {
        return options.sleep_containers.clone();
    }
    let mut refs: Vec<String> = Vec::new();
    for r in targets.iter().filter_map(|t| container_ref(t).ok()) {
        if !refs.iter().any(|x| x == r) {
            refs.push(r.to_string());
        }
    }
    refs
}

/// Reads the labels of `flags` from `containers` and applies them to `options`; returns
/// the `label=value` pairs applied. A reference Docker does not know has no labels (it
/// may be an address); a socket that forbids inspect is warned about, as the preflight
/// does; containers that disagree on a label are an error, never a silent pick.
pub async fn apply_labels(
    lifecycle: &dyn ContainerLifecycle,
    containers: &[String],
    flags: &[&str],
    options: &mut ServiceOptions,
    deadline: Instant,
) -> Result<Vec<String>, String> {
    let mut found: Vec<(&str, String, &str)> = Vec::new(); // (flag, value, container)
    for container in containers {
        let inspected = tokio::time::timeout_at(deadline, lifecycle.inspect(container)).await;
        let info = match inspected {
            Ok(Ok(info)) => info,
            Ok(Err(LifecycleError::NotFound(_))) => continue,
            Ok(Err(LifecycleError::Forbidden(_))) => {
                tracing::warn!(container = %container, "Cannot read sleep labels; the socket denies inspect");
                continue;
            }
            Ok(Err(e)) => {
                return Err(format!(
                    "cannot read the labels of container \"{container}\": {e}"
                ));
            }
            Err(_) => {
                return Err(format!(
                    "cannot read the labels of container \"{container}\": timed out"
                ));
            }
        };
        for &flag in flags {
            let Some(value) = info.labels.get(&label_for(flag)) else {
                continue;
            };
            match found.iter().find(|(f, _, _)| *f == flag) {
                Some((_, v, other)) if v != value => {
                    return Err(format!(
                        "containers \"{other}\" and \"{container}\" disagree on label {}: \"{v}\" and \"{value}\"",
                        label_for(flag)
                    ));
                }
                Some(_) => {}
                None => found.push((flag, value.clone(), container)),
            }
        }
    }
    let mut applied = Vec::new();
    for (flag, value, container) in found {
        let label = label_for(flag);
        apply_value(options, flag, &value).map_err(|e| {
            format!("invalid label {label}=\"{value}\" on container \"{container}\": {e}")
        })?;
        applied.push(format!("{label}={value}"));
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gotime::GoDuration;
    use crate::lifecycle::{ContainerInfo, LifecycleFuture};
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// Containers by name with their labels; anything else is unknown to "Docker".
    struct Labelled(BTreeMap<&'static str, Vec<(&'static str, &'static str)>>);

    impl ContainerLifecycle for Labelled {
        fn start<'a>(&'a self, _: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn stop<'a>(&'a self, _: &'a str, _: Duration) -> LifecycleFuture<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn freeze<'a>(&'a self, _: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn thaw<'a>(&'a self, _: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn list<'a>(
            &'a self,
            _: &'a [String],
        ) -> LifecycleFuture<'a, Vec<crate::lifecycle::ListedContainer>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn inspect<'a>(&'a self, c: &'a str) -> LifecycleFuture<'a, ContainerInfo> {
            Box::pin(async move {
                let labels = self
                    .0
                    .get(c)
                    .ok_or_else(|| LifecycleError::NotFound(c.to_string()))?;
                Ok(ContainerInfo {
                    labels: labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..ContainerInfo::default()
                })
            })
        }
    }

    fn docker(containers: &[(&'static str, &[(&'static str, &'static str)])]) -> Labelled {
        Labelled(containers.iter().map(|(c, l)| (*c, l.to_vec())).collect())
    }

    async fn apply(
        lifecycle: &Labelled,
        containers: &[&str],
        options: &mut ServiceOptions,
    ) -> Result<Vec<String>, String> {
        let containers: Vec<String> = containers.iter().map(|c| c.to_string()).collect();
        let flags = unset_flags(options, &[]);
        let deadline = Instant::now() + Duration::from_secs(5);
        apply_labels(lifecycle, &containers, &flags, options, deadline).await
    }

    #[tokio::test]
    async fn labels_stand_in_for_unset_flags() {
        let d = docker(&[(
            "4f2a9c1b7e3d",
            &[
                ("kamal-proxy.sleep-after", "5m"),
                ("kamal-proxy.wake-timeout", "45s"),
                ("service", "app"),
            ],
        )]);
        let mut o = ServiceOptions::default();
        let applied = apply(&d, &["4f2a9c1b7e3d"], &mut o).await.unwrap();
        assert_eq!(o.sleep_after, GoDuration::from_secs(300));
        assert_eq!(o.wake_timeout, GoDuration::from_secs(45));
        assert_eq!(
            applied,
            ["kamal-proxy.sleep-after=5m", "kamal-proxy.wake-timeout=45s"]
        );
    }

    #[tokio::test]
    async fn a_given_flag_wins_over_its_label() {
        let d = docker(&[("web", &[("kamal-proxy.sleep-after", "5m")])]);
        let mut o = ServiceOptions {
            sleep_after: GoDuration::from_secs(10),
            ..ServiceOptions::default()
        };
        apply(&d, &["web"], &mut o).await.unwrap();
        assert_eq!(o.sleep_after, GoDuration::from_secs(10));
        // Given as zero on the command line: still the flag's.
        let mut o = ServiceOptions::default();
        let flags = unset_flags(&o, &["sleep-after".to_string()]);
        assert_eq!(
            flags,
            [
                "wake-timeout",
                "sleep-container",
                "freeze-after",
                "sleep-label",
                "wake-page"
            ]
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        apply_labels(&d, &["web".into()], &flags, &mut o, deadline)
            .await
            .unwrap();
        assert_eq!(o.sleep_after, GoDuration::ZERO);
    }

    #[tokio::test]
    async fn values_are_parsed_as_the_flags_are() {
        let d = docker(&[("web", &[("kamal-proxy.sleep-after", "300")])]);
        let err = apply(&d, &["web"], &mut ServiceOptions::default())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            "invalid label kamal-proxy.sleep-after=\"300\" on container \"web\": time: missing unit in duration \"300\""
        );
        let d = docker(&[(
            "web",
            &[("kamal-proxy.sleep-container", "app-web, app-worker,")],
        )]);
        let mut o = ServiceOptions::default();
        apply(&d, &["web"], &mut o).await.unwrap();
        assert_eq!(o.sleep_containers, ["app-web", "app-worker"]);

        let d = docker(&[(
            "web",
            &[
                ("kamal-proxy.freeze-after", "30s"),
                ("kamal-proxy.sleep-label", "service=app, role=web"),
                ("kamal-proxy.wake-page", "true"),
            ],
        )]);
        let mut o = ServiceOptions::default();
        apply(&d, &["web"], &mut o).await.unwrap();
        assert_eq!(o.freeze_after, GoDuration::from_secs(30));
        assert_eq!(o.sleep_labels, ["service=app", "role=web"]);
        assert!(o.wake_page);
        let d = docker(&[("web", &[("kamal-proxy.wake-page", "yes")])]);
        let err = apply(&d, &["web"], &mut ServiceOptions::default())
            .await
            .unwrap_err();
        assert!(
            err.starts_with("invalid label kamal-proxy.wake-page=\"yes\""),
            "{err}"
        );
    }

    #[tokio::test]
    async fn containers_must_agree_and_unknown_ones_have_no_labels() {
        let d = docker(&[
            ("a", &[("kamal-proxy.sleep-after", "5m")]),
            ("b", &[("kamal-proxy.sleep-after", "10m")]),
            ("c", &[("kamal-proxy.sleep-after", "5m")]),
        ]);
        let err = apply(&d, &["a", "b"], &mut ServiceOptions::default())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            "containers \"a\" and \"b\" disagree on label kamal-proxy.sleep-after: \"5m\" and \"10m\""
        );
        let mut o = ServiceOptions::default();
        apply(&d, &["a", "c", "172.18.0.5"], &mut o).await.unwrap();
        assert_eq!(o.sleep_after, GoDuration::from_secs(300));
    }

    #[test]
    fn label_sources_are_the_sleep_containers_or_the_targets() {
        let targets = ["4f2a9c1b7e3d:80".to_string(), "4f2a9c1b7e3d:81".to_string()];
        assert_eq!(
            label_sources(&ServiceOptions::default(), &targets),
            ["4f2a9c1b7e3d"]
        );
        let named = ServiceOptions {
            sleep_containers: vec!["app-web".into()],
            ..ServiceOptions::default()
        };
        assert_eq!(label_sources(&named, &targets), ["app-web"]);
    }
}
