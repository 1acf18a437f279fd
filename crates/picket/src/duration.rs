//! Durations on the command line: milliseconds, seconds, minutes and hours in humantime's forms
//! (`500ms`, `1.5s`, `2m`, `1h`, `1m30s`); a bare number is seconds.

use std::time::Duration;

/// Parses a duration such as `250ms`, `1.5s`, `2m`, `1h` or `1m30s`.
///
/// # Errors
/// A sentence saying what forms are accepted.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let usage = || format!("{text:?} is not a duration such as 500ms, 1.5s, 10s, 2m, 1h or 1m30s");
    // Only milliseconds, seconds, minutes and hours: humantime also reads days, weeks, years
    // and `M` as months, and `--ttl 2M` meant as minutes must not become two months.
    if text.is_empty()
        || !text.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | ' ' | 'm' | 's' | 'h'))
    {
        return Err(usage());
    }
    // A bare number is seconds, as in every TTL flag since the first release.
    let duration = match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds >= 0.0 => {
            Duration::try_from_secs_f64(seconds).map_err(|_| usage())?
        }
        Ok(_) => return Err(usage()),
        Err(_) => {
            humantime::parse_duration(text).map_err(|error| format!("{} ({error})", usage()))?
        }
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
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("2M").is_err(), "months are not a unit here");
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999h").is_err());
    }
}
