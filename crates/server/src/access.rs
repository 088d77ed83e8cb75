//! Who may do what: the rights of TLS users on key prefixes, from the
//! configuration file, decided as a pure function of the user, the key and
//! the rules.
//!
//! Without TLS there are no users and this module is not consulted: every
//! client may do everything (docs/security.md). With TLS:
//! - `lock` acquires, and renews and releases the user's own locks;
//! - `read` gets, checks and lists;
//! - `force` releases anyone's lock;
//! - `admin` is for cluster operations, and status with peer addresses.
//!
//! With no rules, every authenticated user has `lock` and `read` on every
//! key. The users named in `admins` have every right on every key, rules or
//! not. Rules add rights; nothing takes one away.
//!
//! A rule's prefix covers keys by whole segments, `/` separating them:
//! `jobs/` and `jobs` both cover `jobs/nightly`, `jobs` also covers the key
//! `jobs` itself, and neither covers `jobsx` (see [`covers`]). `""` covers
//! every key.

use serde::{Deserialize, Serialize};

/// One right, as the configuration names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Right {
    Lock,
    Read,
    Force,
    Admin,
}

impl Right {
    fn bit(self) -> u8 {
        match self {
            Right::Lock => 1,
            Right::Read => 2,
            Right::Force => 4,
            Right::Admin => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Right::Lock => "lock",
            Right::Read => "read",
            Right::Force => "force",
            Right::Admin => "admin",
        }
    }
}

/// A rule as written in the file:
///
/// ```toml
/// [[rules]]
/// users = ["alice", "bob"]   # or ["*"]: every authenticated user
/// prefixes = ["jobs/"]       # "" is every key
/// rights = ["lock", "read"]
/// ```
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub users: Vec<String>,
    pub prefixes: Vec<String>,
    pub rights: Vec<Right>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    /// `None`: every user (`*`).
    users: Option<Vec<String>>,
    prefixes: Vec<Vec<u8>>,
    rights: u8,
}

impl Rule {
    fn names(&self, user: &str) -> bool {
        self.users.as_ref().is_none_or(|users| users.iter().any(|name| name == user))
    }
}

/// The checked rules of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    admins: Vec<String>,
    rules: Vec<Rule>,
}

impl Access {
    /// Checks the file's `admins` and `rules`: user names as `fencelock cert
    /// create-client` takes them (or `*`), at least one user, prefix and
    /// right per rule.
    pub fn new(admins: Vec<String>, rules: Vec<RuleConfig>) -> Result<Access, String> {
        for admin in &admins {
            fencelock_tls::check_user(admin).map_err(|err| format!("admins: {err}"))?;
        }
        let mut checked = Vec::with_capacity(rules.len());
        for (n, rule) in rules.into_iter().enumerate() {
            let at = format!("rules[{n}]");
            if rule.users.is_empty() || rule.prefixes.is_empty() || rule.rights.is_empty() {
                return Err(format!("{at}: users, prefixes and rights must each name at least one"));
            }
            if rule.rights.contains(&Right::Admin) {
                // It would be silently meaningless: `admin` is for the
                // cluster as a whole, not for keys.
                return Err(format!(
                    "{at}: `admin` is not a right on keys; name the user in `admins` instead"
                ));
            }
            let users = if rule.users.iter().any(|user| user == "*") {
                None
            } else {
                for user in &rule.users {
                    fencelock_tls::check_user(user).map_err(|err| format!("{at}: {err}"))?;
                }
                Some(rule.users)
            };
            checked.push(Rule {
                users,
                prefixes: rule.prefixes.into_iter().map(String::into_bytes).collect(),
                rights: rule.rights.iter().fold(0, |bits, right| bits | right.bit()),
            });
        }
        Ok(Access { admins, rules: checked })
    }

    /// Whether `user` has `right` on `key`.
    pub fn allows(&self, user: &str, right: Right, key: &[u8]) -> bool {
        self.allows_where(user, right, |rule_prefix| covers(rule_prefix, key))
    }

    /// Whether `user` has `right` on every key that starts with `prefix`
    /// (what a listing of `prefix` may show): some rule must cover every
    /// such key (see [`covers_all_under`]).
    pub fn allows_all_under(&self, user: &str, right: Right, prefix: &[u8]) -> bool {
        self.allows_where(user, right, |rule_prefix| covers_all_under(rule_prefix, prefix))
    }

    /// Whether `user` has `right` on some key at least: what opening a
    /// session needs (`lock`), since a session exists to hold locks.
    pub fn allows_somewhere(&self, user: &str, right: Right) -> bool {
        self.allows_where(user, right, |_| true)
    }

    /// Whether `user` has `right` on the cluster as a whole (`admin`).
    pub fn is_admin(&self, user: &str) -> bool {
        self.admins.iter().any(|admin| admin == user)
    }

    fn allows_where(&self, user: &str, right: Right, covers: impl Fn(&[u8]) -> bool) -> bool {
        if self.is_admin(user) {
            return true;
        }
        if self.rules.is_empty() {
            return matches!(right, Right::Lock | Right::Read);
        }
        self.rules.iter().any(|rule| {
            rule.rights & right.bit() != 0
                && rule.names(user)
                && rule.prefixes.iter().any(|prefix| covers(prefix))
        })
    }

    /// How many rules there are, for the start-up log.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// How many admins there are, for the start-up log.
    pub fn admin_count(&self) -> usize {
        self.admins.len()
    }
}

/// Whether a rule on `rule_prefix` covers `key`, by whole segments: the
/// key is the prefix, or goes on after it at a segment's start (the prefix
/// ends with `/`, or the key goes on with one). `""` covers every key.
pub fn covers(rule_prefix: &[u8], key: &[u8]) -> bool {
    key == rule_prefix || covers_all_under(rule_prefix, key)
}

/// Whether a rule on `rule_prefix` covers every key that starts with
/// `prefix` (bytewise, as a listing takes it): `prefix` must go on from the
/// rule's prefix at a segment's start. A listing of `jobs` is not covered
/// by a rule on `jobs`, since it shows `jobsx` too; one of `jobs/` is.
pub fn covers_all_under(rule_prefix: &[u8], prefix: &[u8]) -> bool {
    match prefix.strip_prefix(rule_prefix) {
        Some(rest) => rule_prefix.is_empty() || rule_prefix.ends_with(b"/") || rest.starts_with(b"/"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(users: &[&str], prefixes: &[&str], rights: &[Right]) -> RuleConfig {
        RuleConfig {
            users: users.iter().map(|s| s.to_string()).collect(),
            prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            rights: rights.to_vec(),
        }
    }

    #[test]
    fn without_rules_users_lock_and_read_everywhere_and_only_admins_force() {
        let access = Access::new(vec!["ops".into()], Vec::new()).unwrap();
        for key in [&b"jobs/x"[..], b"", b"\xff"] {
            assert!(access.allows("alice", Right::Lock, key));
            assert!(access.allows("alice", Right::Read, key));
            assert!(!access.allows("alice", Right::Force, key));
            assert!(!access.allows("alice", Right::Admin, key));
            assert!(access.allows("ops", Right::Force, key));
        }
        assert!(access.allows_all_under("alice", Right::Read, b""));
        assert!(!access.is_admin("alice"));
        assert!(access.is_admin("ops"));
    }

    #[test]
    fn rules_give_rights_on_their_prefixes_only() {
        let rules = vec![
            rule(&["alice", "bob"], &["jobs/", "leader/"], &[Right::Lock, Right::Read]),
            rule(&["*"], &["public/"], &[Right::Read]),
            rule(&["carol"], &["jobs/"], &[Right::Force]),
        ];
        let access = Access::new(vec!["ops".into()], rules).unwrap();
        assert!(access.allows("alice", Right::Lock, b"jobs/nightly"));
        assert!(access.allows("bob", Right::Read, b"leader/db"));
        assert!(!access.allows("alice", Right::Lock, b"public/x"));
        assert!(access.allows("alice", Right::Read, b"public/x"));
        assert!(access.allows("dave", Right::Read, b"public/x"));
        assert!(!access.allows("dave", Right::Lock, b"jobs/x"));
        assert!(!access.allows("alice", Right::Lock, b"job"));
        assert!(!access.allows("alice", Right::Force, b"jobs/x"));
        assert!(access.allows("carol", Right::Force, b"jobs/x"));
        assert!(!access.allows("carol", Right::Lock, b"jobs/x"));
        assert!(access.allows("ops", Right::Lock, b"anything"));
        // A listing must be covered as a whole.
        assert!(access.allows_all_under("alice", Right::Read, b"jobs/"));
        assert!(access.allows_all_under("alice", Right::Read, b"jobs/night"));
        assert!(!access.allows_all_under("alice", Right::Read, b"jobs"));
        assert!(!access.allows_all_under("alice", Right::Read, b""));
        assert!(access.allows_all_under("ops", Right::Read, b""));
    }

    #[test]
    fn bad_rules_are_refused_with_where() {
        for (admins, rules, needle) in [
            (vec!["node".to_owned()], vec![], "admins"),
            (vec![], vec![rule(&[], &["a"], &[Right::Read])], "rules[0]"),
            (
                vec![],
                vec![rule(&["a"], &["a"], &[Right::Read]), rule(&["bad name"], &["a"], &[Right::Read])],
                "rules[1]",
            ),
            (vec![], vec![rule(&["a"], &[], &[Right::Read])], "at least one"),
            (vec![], vec![rule(&["a"], &["x"], &[])], "at least one"),
            (
                vec![],
                vec![rule(&["a"], &["x"], &[Right::Read, Right::Admin])],
                "`admin` is not a right on keys",
            ),
        ] {
            let err = Access::new(admins, rules).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn a_rule_covers_keys_by_whole_segments() {
        for (rule, key, covered) in [
            ("jobs/", "jobs/nightly", true),
            ("jobs", "jobs/nightly", true),
            ("jobs", "jobs", true),
            ("jobs/", "jobs", false),
            ("jobs", "jobsx", false),
            ("jobs/", "jobsx/a", false),
            ("a", "admin/x", false),
            ("jobs/night", "jobs/nightly", false),
            ("jobs/night", "jobs/night/1", true),
            ("", "anything", true),
            ("jobs", "job", false),
        ] {
            assert_eq!(covers(rule.as_bytes(), key.as_bytes()), covered, "rule {rule:?} on key {key:?}");
        }
        for (rule, listing, covered) in [
            ("jobs/", "jobs/", true),
            ("jobs/", "jobs/n", true),
            ("jobs", "jobs/", true),
            ("jobs", "jobs", false),
            ("jobs/", "jobs", false),
            ("a", "admin/", false),
            ("", "", true),
            ("jobs/", "", false),
        ] {
            assert_eq!(
                covers_all_under(rule.as_bytes(), listing.as_bytes()),
                covered,
                "rule {rule:?} on a listing of {listing:?}"
            );
        }
        // Through the rules: a rule on `a` gives nothing under `admin/`.
        let access =
            Access::new(vec![], vec![rule(&["alice"], &["a"], &[Right::Lock, Right::Read])]).unwrap();
        assert!(access.allows("alice", Right::Lock, b"a/1"));
        assert!(!access.allows("alice", Right::Lock, b"admin/x"));
        assert!(!access.allows_all_under("alice", Right::Read, b"ad"));
        assert!(access.allows_all_under("alice", Right::Read, b"a/"));
    }
}
