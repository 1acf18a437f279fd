//! Durations on the command line, in humantime's forms (`500ms`, `10s`, `2m`, `1h`, `1m30s`); a
//! bare number is seconds.

use std::time::Duration;

/// Parses a duration such as `250ms`, `10s`, `2m`, `1h` or `1m30s`.
///
/// # Errors
/// A sentence saying what forms are accepted.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    // A bare number is seconds, as in every TTL flag since the first release.
    let duration = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text).map_err(|error| {
            format!("{text:?} is not a duration such as 500ms, 10s, 2m, 1h or 1m30s ({error})")
        })?,
    };
    if duration > MAX_DURATION {
        return Err(format!("{text:?} is out of range: at most 366 days"));
    }
    Ok(duration)
}

/// The longest duration any flag takes.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3_600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms_and_refuses_the_rest() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999h").is_err());
    }
}
