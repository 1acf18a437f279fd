use super::*;

fn prefixes(configured: &[&str]) -> Prefixes {
    let mut configured: Vec<String> = configured.iter().map(|p| (*p).to_owned()).collect();
    configured.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    Prefixes { configured, seen: Mutex::default() }
}

#[test]
fn a_name_counts_under_its_longest_configured_prefix_or_other() {
    let prefixes = prefixes(&["jobs/", "jobs/report/"]);
    assert_eq!(prefixes.label("jobs/report/daily"), "jobs/report/");
    assert_eq!(prefixes.label("jobs/x"), "jobs/");
    assert_eq!(prefixes.label("tenants/a"), OTHER);
}

#[test]
fn without_configured_prefixes_the_first_segments_are_bounded() {
    let prefixes = prefixes(&[]);
    assert_eq!(prefixes.label("jobs/report"), "jobs");
    assert_eq!(prefixes.label("plain"), "plain");
    for segment in 0..MAX_PREFIX_LABELS * 2 {
        prefixes.label(&format!("t{segment}/x"));
    }
    assert_eq!(prefixes.seen.lock().expect("not poisoned").len(), MAX_PREFIX_LABELS);
    assert_eq!(prefixes.label("a-new-one/x"), OTHER);
    assert_eq!(prefixes.label("jobs/again"), "jobs", "a seen prefix keeps its label");
}
