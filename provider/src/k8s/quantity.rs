//! Kubernetes resource quantities (`500m`, `2`, `512Mi`, `1G`, `1e9`) as numbers.

/// A quantity that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a Kubernetes quantity")]
pub struct QuantityError(pub String);

/// The quantity's value in base units (cores for CPU, bytes for memory).
pub fn parse(text: &str) -> Result<f64, QuantityError> {
    let text = text.trim();
    let fail = || QuantityError(text.to_owned());
    let split = text
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        _ => return Err(fail()),
    };
    let value: f64 = number.parse().map_err(|_| fail())?;
    if !value.is_finite() || value < 0.0 {
        return Err(fail());
    }
    Ok(value * multiplier)
}

/// Bytes as GiB.
pub fn gib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(parse("500m").unwrap(), 0.5);
        assert_eq!(parse("2").unwrap(), 2.0);
        assert_eq!(parse("1.5").unwrap(), 1.5);
        assert_eq!(gib(parse("512Mi").unwrap()), 0.5);
        assert_eq!(parse("1G").unwrap(), 1e9);
        assert_eq!(parse("1e9").unwrap(), 1e9);
        assert_eq!(gib(parse("4Gi").unwrap()), 4.0);
        for bad in ["", "abc", "1x", "-1", "Gi"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
