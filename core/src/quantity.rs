//! Kubernetes resource quantities (`500m`, `2`, `512Mi`, `1G`, `1e3`, `+1.5E-3`) read the way
//! the apiserver reads them (`resource.ParseQuantity` of k8s.io/apimachinery; k8s-openapi's
//! `Quantity` carries the string). The one parser of the daemon: configuration, translation,
//! the Selector engine and the node's capacity all read quantities here.
//!
//! - Grammar: an optional sign, digits with an optional fraction (`1`, `1.`, `.5`, `1.5`), then
//!   a binary suffix (`Ki` … `Ei`), a decimal one (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`,
//!   `E`) or an exponent (`e` or `E` and a signed integer). No spaces. Where Go's hand-written
//!   parser is laxer than the API's published pattern (it reads `.`, `-` and `Gi` as zero),
//!   the pattern wins: those are refused.
//! - Value: exact, as a whole number of nano-units; finer amounts are rounded up (away from
//!   zero), as the apiserver does so that asking for a little gets a little. Magnitudes are
//!   capped at 2^63−1 base units, as the apiserver caps its SI forms (it leaves exponent forms
//!   beyond that uncapped; nothing the daemon compares comes near).
//! - Canonical form: what the apiserver writes back (`6000` → `6k`, `0.5Gi` → `512Mi`,
//!   `1000m` → `1`, `1E3` → `1e3`), so a value can be compared with what was read back.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Nano-units per base unit.
const NANOS: i128 = 1_000_000_000;
/// The largest magnitude kept: 2^63−1 base units.
const MAX_NANOS: i128 = i64::MAX as i128 * NANOS;

/// A quantity that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not the quantity grammar (empty, spaces, no digits, an unknown suffix, a bad exponent).
    #[error("{text:?} is not a Kubernetes quantity")]
    Syntax {
        /// What was given.
        text: String,
    },
    /// A negative quantity where an amount is expected.
    #[error("{text:?} is negative; a Kubernetes quantity of zero or more is expected")]
    Negative {
        /// What was given.
        text: String,
    },
}

/// How a quantity was written, which decides its canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// No suffix or a decimal one (`m`, `k`, `M`, …).
    DecimalSi,
    /// A binary suffix (`Ki`, `Mi`, …).
    BinarySi,
    /// An exponent (`1e3`).
    DecimalExponent,
}

/// A quantity: an exact amount of nano-units and the form it was written in. Equality and
/// order are by amount (`1Gi` == `1073741824`, `0.1` == `100m`).
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// Zero.
impl Default for Quantity {
    fn default() -> Self {
        Self {
            nanos: 0,
            format: Format::DecimalSi,
        }
    }
}

impl std::ops::Add for Quantity {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        self.plus(other)
    }
}

impl std::ops::AddAssign for Quantity {
    fn add_assign(&mut self, other: Self) {
        *self = self.plus(other);
    }
}

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

/// The suffix's form, power of ten and power of 1024.
fn suffix(text: &str) -> Option<(Format, i64, u32)> {
    let decimal = |exponent| Some((Format::DecimalSi, exponent, 0));
    let binary = |power| Some((Format::BinarySi, 0, power));
    match text {
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        _ => {
            let exponent = text.strip_prefix(['e', 'E'])?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((
                Format::DecimalExponent,
                i64::from(exponent.parse::<i32>().ok()?),
                0,
            ))
        }
    }
}

/// `digits` (most significant first) times `factor`, in place.
fn multiply(digits: &mut Vec<u8>, factor: u32) {
    let mut carry = 0u64;
    for digit in digits.iter_mut().rev() {
        let product = u64::from(*digit) * u64::from(factor) + carry;
        *digit = u8::try_from(product % 10).unwrap_or_default();
        carry = product / 10;
    }
    while carry > 0 {
        digits.insert(0, u8::try_from(carry % 10).unwrap_or_default());
        carry /= 10;
    }
}

/// The value of decimal `digits`, or None past the cap.
fn value(digits: &[u8]) -> Option<i128> {
    digits
        .iter()
        .try_fold(0i128, |sum, &digit| {
            sum.checked_mul(10)?.checked_add(i128::from(digit))
        })
        .filter(|&nanos| nanos <= MAX_NANOS)
}

/// The magnitude in nano-units of `digits` × 1024^`power` × 10^`exponent`, rounded up, capped.
fn magnitude(mut digits: Vec<u8>, power: u32, exponent: i64) -> i128 {
    for _ in 0..power {
        multiply(&mut digits, 1024);
    }
    let first = digits.iter().position(|&d| d != 0).unwrap_or(digits.len());
    digits.drain(..first);
    if digits.is_empty() {
        return 0;
    }
    let length = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    if exponent >= 0 {
        // More than 29 digits is beyond the cap (~9.2e27 nano-units) whatever they are.
        if length.saturating_add(exponent) > 29 {
            return MAX_NANOS;
        }
        digits.extend(std::iter::repeat_n(
            0,
            usize::try_from(exponent).unwrap_or(0),
        ));
        return value(&digits).unwrap_or(MAX_NANOS);
    }
    let fraction = exponent.unsigned_abs();
    if u64::try_from(length).unwrap_or(0) <= fraction {
        // All of it is below one nano-unit: rounded up to one.
        return 1;
    }
    let whole = digits.len() - usize::try_from(fraction).unwrap_or(0);
    let rounded_up = digits[whole..].iter().any(|&d| d != 0);
    match value(&digits[..whole]) {
        Some(nanos) => (nanos + i128::from(rounded_up)).min(MAX_NANOS),
        None => MAX_NANOS,
    }
}

impl Quantity {
    /// Reads `text` (see the module's doc for the grammar and the rounding).
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let syntax = || QuantityError::Syntax {
            text: text.to_owned(),
        };
        let (negative, unsigned) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let whole_end = unsigned
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(unsigned.len());
        let (whole, rest) = unsigned.split_at(whole_end);
        let (fraction, rest) = match rest.strip_prefix('.') {
            Some(after) => {
                let end = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(end)
            }
            None => ("", rest),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(syntax());
        }
        let (format, exponent, power) = suffix(rest).ok_or_else(syntax)?;
        let digits: Vec<u8> = whole
            .bytes()
            .chain(fraction.bytes())
            .map(|b| b - b'0')
            .collect();
        let fraction_digits = i64::try_from(fraction.len()).map_err(|_| syntax())?;
        let nanos = magnitude(digits, power, exponent - fraction_digits + 9);
        Ok(Self {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }

    /// `nanos` nano-units, written in `format`.
    pub fn from_nanos(nanos: i128, format: Format) -> Self {
        Self {
            nanos: nanos.clamp(-MAX_NANOS, MAX_NANOS),
            format,
        }
    }

    /// The exact amount in nano-units.
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    /// How it was written.
    pub fn format(self) -> Format {
        self.format
    }

    /// Below zero.
    pub fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// The amount in base units, rounded up to a whole one (the apiserver's `Value()`).
    pub fn value_ceil(self) -> i128 {
        self.nanos.div_euclid(NANOS) + i128::from(self.nanos.rem_euclid(NANOS) != 0)
    }

    /// The amount in milli-units, rounded up (the apiserver's `MilliValue()`).
    pub fn milli_ceil(self) -> i128 {
        let per_milli = NANOS / 1000;
        self.nanos.div_euclid(per_milli) + i128::from(self.nanos.rem_euclid(per_milli) != 0)
    }

    /// The amount in base units as a float (exact for whole amounts up to 2^53).
    #[allow(clippy::cast_precision_loss)]
    pub fn as_f64(self) -> f64 {
        // Whole and fraction apart: the whole part converts exactly, the fraction rounds once.
        (self.nanos / NANOS) as f64 + (self.nanos % NANOS) as f64 / 1e9
    }

    /// The sum (saturating at the cap), written as `self`.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self::from_nanos(self.nanos.saturating_add(other.nanos), self.format)
    }

    /// The form the apiserver writes the quantity back in.
    pub fn canonical(self) -> String {
        if self.nanos == 0 {
            return "0".to_owned();
        }
        if self.format == Format::BinarySi
            && self.nanos.abs() >= 1024 * NANOS
            && self.nanos % NANOS == 0
        {
            let (mut amount, mut power) = (self.nanos / NANOS, 0usize);
            while amount % 1024 == 0 && power < 6 {
                amount /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
            return format!("{amount}{suffix}");
        }
        // A mantissa without trailing zeros, then the exponent brought down to a multiple of
        // three (`1500m`, not `1.5`).
        let (mut mantissa, mut exponent) = (self.nanos, -9i64);
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        match exponent.rem_euclid(3) {
            1 => (mantissa, exponent) = (mantissa * 10, exponent - 1),
            2 => (mantissa, exponent) = (mantissa * 100, exponent - 2),
            _ => {}
        }
        let suffix = match (self.format, exponent) {
            (Format::DecimalExponent, 0) => String::new(),
            (Format::DecimalExponent, exponent) => format!("e{exponent}"),
            (_, -9) => "n".into(),
            (_, -6) => "u".into(),
            (_, -3) => "m".into(),
            (_, 3) => "k".into(),
            (_, 6) => "M".into(),
            (_, 9) => "G".into(),
            (_, 12) => "T".into(),
            (_, 15) => "P".into(),
            (_, 18) => "E".into(),
            _ => String::new(),
        };
        format!("{mantissa}{suffix}")
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// An amount of zero or more in base units (cores for CPU, bytes for memory) as a float, for
/// what ECI is sent and ratios; compare [`Quantity`] values where exactness matters.
pub fn parse(text: &str) -> Result<f64, QuantityError> {
    let quantity = Quantity::parse(text)?;
    if quantity.is_negative() {
        return Err(QuantityError::Negative {
            text: text.to_owned(),
        });
    }
    Ok(quantity.as_f64())
}

/// Whether `text` is a quantity of zero or more.
pub fn is_amount(text: &str) -> bool {
    Quantity::parse(text).is_ok_and(|q| !q.is_negative())
}

/// Bytes as GiB.
pub fn gib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0 * 1024.0)
}

#[cfg(test)]
mod tests;
