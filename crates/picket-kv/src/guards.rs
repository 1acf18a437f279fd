//! Which guarded resource a request touches: the longest guarded prefix of its key.

use axum::http::request::Parts;
use picket_fence::Policy;

/// The guards, longest prefix first, so a key belongs to the most specific guard.
#[derive(Debug)]
pub(crate) struct Guards(pub(crate) Vec<(String, Policy)>);

impl Guards {
    pub(crate) fn for_key(&self, key: &str) -> Option<(String, Policy)> {
        self.0.iter().find(|(prefix, _)| key.starts_with(prefix.as_str())).cloned()
    }

    fn exact(&self, prefix: &str) -> Option<(String, Policy)> {
        self.0.iter().find(|(guarded, _)| guarded == prefix).cloned()
    }
}

pub(crate) fn resolve(guards: &Guards, parts: &Parts) -> Option<(String, Policy)> {
    // Strictly: a path with a malformed escape names no key, so it is refused as unguarded.
    let path = picket_core::decode_escaped(parts.uri.path())?;
    if let Some(key) = path.strip_prefix("/kv/") {
        return guards.for_key(key);
    }
    path.strip_prefix("/fence/").and_then(|prefix| guards.exact(prefix))
}
