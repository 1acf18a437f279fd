//! Durations on the command line: `500ms`, `10s`, `2m`, `1h`; a bare number is seconds.

use std::time::Duration;

/// Parses a duration such as `250ms`, `10s`, `1.5s`, `2m` or `1h`.
///
/// # Errors
/// A sentence saying what forms are accepted.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 10s, 2m or 1h"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1_000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3_600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?}: use ms, s, m or h")),
    };
    if !seconds.is_finite() || !(0.0..=366.0 * 24.0 * 3_600.0).contains(&seconds) {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms_and_refuses_the_rest() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999h").is_err());
    }
}
