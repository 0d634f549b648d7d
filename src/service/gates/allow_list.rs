//! `--allow-ip`: only listed client addresses reach the service (403 otherwise).

use std::net::IpAddr;

use super::client_ip::IpList;

#[derive(Debug, Clone)]
pub struct AllowList {
    list: IpList,
}

impl AllowList {
    pub fn new(list: IpList) -> AllowList {
        AllowList { list }
    }

    /// A list that admits nobody: what an unreadable stored list becomes (fail closed).
    pub fn deny_all() -> AllowList {
        AllowList {
            list: IpList::default(),
        }
    }

    /// "No address" (an unresolvable forwarded chain) is never allowed, not even by a
    /// default route.
    pub fn permits(&self, client: Option<IpAddr>) -> bool {
        client.is_some_and(|a| self.list.contains(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_address_matches_nothing() {
        let all = IpList::parse(&["0.0.0.0/0".into(), "::/0".into()], "allow-ip").unwrap();
        let l = AllowList::new(all);
        assert!(l.permits(Some("203.0.113.1".parse().unwrap())));
        assert!(l.permits(Some("2001:db8::1".parse().unwrap())));
        assert!(!l.permits(None));
        assert!(!AllowList::deny_all().permits(Some("127.0.0.1".parse().unwrap())));
    }
}
