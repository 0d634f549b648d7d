//! `kamal-proxy rollout deploy|set|stop` (upstream §1.9): a second pool beside a service's
//! active one, and the share of requests (chosen by the app's `kamal-rollout` cookie) it
//! gets.

use clap::{ArgAction, Args, Subcommand};

use super::values::{duration, int64, non_empty};
use crate::control::{Request, RolloutDeployArgs};
use crate::gotime::GoDuration;
use crate::options::DeploymentOptions;

#[derive(Args, Debug)]
#[command(
    about = "Manage rollout settings",
    long_about = "Manage rollout settings.\n\n\
A rollout runs a second set of targets beside a service's active ones. Requests go to it when\n\
their `kamal-rollout` cookie (set by the app, never by the proxy) is in the `--list` of\n\
`rollout set`, or hashes into its `--percent` share.\n\n\
Example:\n  kamal-proxy rollout deploy app-web --target=\"app-web-new:3000\"\n  \
kamal-proxy rollout set app-web --percent=10 --list=\"staff-1,staff-2\"\n  \
kamal-proxy rollout stop app-web"
)]
pub struct RolloutCmd {
    #[command(subcommand)]
    command: Option<RolloutCommand>,
}

#[derive(Subcommand, Debug)]
enum RolloutCommand {
    /// Deploy the rollout target
    #[command(
        override_usage = "kamal-proxy rollout deploy <SERVICE> --target=<HOST:PORT> [OPTIONS]"
    )]
    Deploy(DeployCmd),
    /// Set traffic split for rollout
    #[command(
        override_usage = "kamal-proxy rollout set <SERVICE> [--percent=N] [--list=VALUE,...]"
    )]
    Set(SetCmd),
    /// Stops rollout of a service
    #[command(override_usage = "kamal-proxy rollout stop <SERVICE>")]
    Stop(StopCmd),
}

#[derive(Args, Debug)]
struct DeployCmd {
    /// Name of the service
    #[arg(value_name = "SERVICE")]
    service: Vec<String>,
    /// Target host(s) to deploy (repeatable, or comma-separated); 'host:port;weight=N' (1-1000, quoted for the shell) sets a target's share of the rollout pool's requests [required]
    #[arg(long, value_delimiter = ',', action = ArgAction::Append, value_name = "HOST:PORT[;weight=N]")]
    target: Option<Vec<String>>,
    /// Read-only target host(s) to deploy; ';weight=N' weighs readers among themselves
    #[arg(long = "read-target", value_delimiter = ',', action = ArgAction::Append, value_name = "HOST:PORT[;weight=N]")]
    read_target: Vec<String>,
    /// Maximum time to wait for the new target to become healthy
    #[arg(long = "deploy-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    deploy_timeout: GoDuration,
    /// Maximum time to allow existing connections to drain before removing old target
    #[arg(long = "drain-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    drain_timeout: GoDuration,
}

#[derive(Args, Debug)]
struct SetCmd {
    /// Name of the service
    #[arg(value_name = "SERVICE")]
    service: Vec<String>,
    /// Percentage of traffic to send to the new target [default: 0]
    #[arg(long, value_parser = int64, value_name = "N", allow_negative_numbers = true)]
    percent: Option<i64>,
    /// Rollout to specific values (of the kamal-rollout cookie; repeatable, or comma-separated)
    #[arg(long, value_delimiter = ',', action = ArgAction::Append, value_name = "VALUE")]
    list: Option<Vec<String>>,
}

#[derive(Args, Debug)]
struct StopCmd {
    /// Name of the service
    #[arg(value_name = "SERVICE")]
    service: Vec<String>,
}

impl RolloutCmd {
    pub fn execute(&self) -> Result<(), String> {
        match &self.command {
            None => {
                // A group without an action of its own prints its help, as upstream.
                let mut group = <super::Cli as clap::CommandFactory>::command();
                if let Some(rollout) = group.find_subcommand_mut("rollout") {
                    let _ = rollout.print_help();
                }
                Ok(())
            }
            Some(RolloutCommand::Deploy(c)) => super::call(c.to_request()?).map(|_| ()),
            Some(RolloutCommand::Set(c)) => super::call(c.to_request()?).map(|_| ()),
            Some(RolloutCommand::Stop(c)) => {
                let service = super::exactly_one(&c.service)?;
                super::call(Request::RolloutStop { service }).map(|_| ())
            }
        }
    }
}

impl DeployCmd {
    fn to_request(&self) -> Result<Request, String> {
        let service = super::exactly_one(&self.service)?;
        let Some(target) = &self.target else {
            return Err("required flag(s) \"target\" not set".into());
        };
        // The addresses are left to the server, as upstream's CLI does: it answers `service
        // not found` first for an unknown service, then refuses a bad address before
        // anything is probed or saved.
        let targets = non_empty(target.clone());
        let readers = non_empty(self.read_target.clone());
        Ok(Request::RolloutDeploy(RolloutDeployArgs {
            service,
            targets,
            readers,
            deployment: DeploymentOptions {
                deploy_timeout: self.deploy_timeout,
                drain_timeout: self.drain_timeout,
                force: false,
            },
        }))
    }
}

impl SetCmd {
    fn to_request(&self) -> Result<Request, String> {
        let service = super::exactly_one(&self.service)?;
        if self.percent.is_none() && self.list.is_none() {
            return Err("at least one of the flags in the group [percent list] is required".into());
        }
        Ok(Request::RolloutSet {
            service,
            percentage: self.percent.unwrap_or(0),
            allowlist: non_empty(self.list.clone().unwrap_or_default()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(subcommand)]
        command: RolloutCommand,
    }

    fn parse(args: &[&str]) -> RolloutCommand {
        let argv = std::iter::once("rollout").chain(args.iter().copied());
        Wrapper::try_parse_from(argv).expect("parses").command
    }

    #[test]
    fn set_needs_a_percent_or_a_list() {
        let RolloutCommand::Set(c) = parse(&["set", "app"]) else {
            panic!()
        };
        assert_eq!(
            c.to_request().unwrap_err(),
            "at least one of the flags in the group [percent list] is required"
        );
        let RolloutCommand::Set(c) = parse(&["set", "app", "--list=a,b", "--list", "c"]) else {
            panic!()
        };
        match c.to_request().unwrap() {
            Request::RolloutSet {
                percentage,
                allowlist,
                ..
            } => assert_eq!(
                (percentage, allowlist),
                (0, vec!["a".into(), "b".into(), "c".into()])
            ),
            other => panic!("{other:?}"),
        }
        let RolloutCommand::Set(c) = parse(&["set", "app", "--percent=150"]) else {
            panic!()
        };
        assert!(c.to_request().is_ok(), "no range check, as upstream");
    }

    #[test]
    fn deploy_needs_a_target_and_leaves_its_address_to_the_server() {
        let RolloutCommand::Deploy(c) = parse(&["deploy", "app"]) else {
            panic!()
        };
        assert_eq!(
            c.to_request().unwrap_err(),
            "required flag(s) \"target\" not set"
        );
        let RolloutCommand::Deploy(c) = parse(&["deploy", "app", "--target=http://x"]) else {
            panic!()
        };
        match c.to_request().unwrap() {
            Request::RolloutDeploy(args) => assert_eq!(args.targets, ["http://x"]),
            other => panic!("{other:?}"),
        }
    }
}
