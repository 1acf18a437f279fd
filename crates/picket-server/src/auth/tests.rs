use super::file::{Table, parse};
use super::*;
use std::path::Path;

fn table(text: &str) -> Result<Table, String> {
    parse(Path::new("auth.toml"), text)
}

fn principal(name: &str, lock: &[&str], read: &[&str]) -> Principal {
    let owned = |prefixes: &[&str]| prefixes.iter().map(|prefix| (*prefix).to_owned()).collect();
    Principal { name: name.into(), lock: owned(lock), read: owned(read), admin: false }
}

#[test]
fn roles_cover_their_prefixes_and_lock_implies_read() {
    let worker = principal("worker", &["jobs/"], &["reports/"]);
    assert!(worker.covers(Role::Lock, "jobs/nightly"));
    assert!(!worker.covers(Role::Lock, "reports/daily"));
    assert!(worker.covers(Role::Read, "reports/daily"));
    assert!(worker.covers(Role::Read, "jobs/nightly"));
    assert!(!worker.covers(Role::Read, "billing/x"));
    assert!(worker.covers_prefix(Role::Read, "jobs/night"));
    assert!(!worker.covers_prefix(Role::Read, "jobs"));
    assert!(!worker.covers_prefix(Role::Read, ""));
}

#[test]
fn tokens_are_found_by_their_digest_only() {
    let digest = hex(&token_digest("s3cret"));
    assert_eq!(digest.len(), 64);
    let parsed = table(&format!(
        "[[principal]]\nname = \"ci\"\ntoken_sha256 = [\"{digest}\"]\nlock = [\"jobs/\"]\n"
    ))
    .unwrap();
    assert_eq!(parsed.by_token[&token_digest("s3cret")].name, "ci");
    assert!(!parsed.by_token.contains_key(&token_digest("s3cret ")));
}

#[test]
fn broken_files_name_the_principal_and_the_rule() {
    let digest = hex(&token_digest("x"));
    for (text, expected) in [
        ("[[principal]]\nname = \"\"\n", "1 to 128 bytes"),
        ("[[principal]]\nname = \"a\"\n[[principal]]\nname = \"a\"\n", "listed twice"),
        ("[[principal]]\nname = \"a\"\ntoken_sha256 = [\"abc\"]\n", "not a hex SHA-256"),
        ("[[principal]]\nname = \"a\"\nrole = \"x\"\n", "unknown field"),
        (
            &format!(
                "[[principal]]\nname = \"a\"\ntoken_sha256 = [\"{digest}\"]\n[[principal]]\nname = \"b\"\ntoken_sha256 = [\"{digest}\"]\n"
            ),
            "belongs to another principal",
        ),
    ] {
        let error = table(text).unwrap_err();
        assert!(error.contains(expected), "{text:?}: {error}");
    }
}
