//! Validation of lock names.

use crate::error::NameError;
use crate::limits::Limits;

/// Checks a lock name against the limits: not empty, at most `max_name_bytes` bytes of UTF-8,
/// and no control characters (they break logs, terminals and HTTP headers).
///
/// Any other character is allowed, including `/`, so names can form hierarchies that prefix
/// listings and prefix watches understand.
///
/// # Errors
/// [`NameError`] says which rule the name breaks.
pub fn validate_name(name: &str, limits: &Limits) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > limits.max_name_bytes {
        return Err(NameError::TooLong { len_bytes: name.len(), max_bytes: limits.max_name_bytes });
    }
    if let Some((index_bytes, _)) = name.char_indices().find(|(_, c)| c.is_control()) {
        return Err(NameError::ControlCharacter { index_bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_hierarchical_and_unicode_names() {
        let limits = Limits::default();
        assert_eq!(validate_name("jobs/nightly-report", &limits), Ok(()));
        assert_eq!(validate_name("données/été", &limits), Ok(()));
        assert_eq!(validate_name(&"a".repeat(limits.max_name_bytes), &limits), Ok(()));
    }

    #[test]
    fn refuses_empty_long_and_control_characters() {
        let limits = Limits::default();
        assert_eq!(validate_name("", &limits), Err(NameError::Empty));
        assert_eq!(
            validate_name(&"a".repeat(limits.max_name_bytes + 1), &limits),
            Err(NameError::TooLong { len_bytes: 257, max_bytes: 256 })
        );
        assert_eq!(
            validate_name("bad\nname", &limits),
            Err(NameError::ControlCharacter { index_bytes: 3 })
        );
        assert_eq!(
            validate_name("nul\0", &limits),
            Err(NameError::ControlCharacter { index_bytes: 3 })
        );
    }
}
