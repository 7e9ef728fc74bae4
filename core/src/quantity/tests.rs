//! The grammar, the exact values and the canonical forms, as tables (cases from
//! apimachinery's quantity tests where they apply).

use super::*;

const N: i128 = 1_000_000_000;

#[test]
fn values_and_canonical_forms() {
    // (written, exact nano-units, what the apiserver writes back)
    let cases: &[(&str, i128, &str)] = &[
        ("0", 0, "0"),
        ("0n", 0, "0"),
        ("0Ki", 0, "0"),
        ("0e0", 0, "0"),
        ("-0", 0, "0"),
        ("1n", 1, "1n"),
        ("1u", 1_000, "1u"),
        ("1m", 1_000_000, "1m"),
        ("1", N, "1"),
        ("1k", 1_000 * N, "1k"),
        ("1M", 1_000_000 * N, "1M"),
        ("1G", 1_000_000_000 * N, "1G"),
        ("1T", 10i128.pow(12) * N, "1T"),
        ("1P", 10i128.pow(15) * N, "1P"),
        ("1E", 10i128.pow(18) * N, "1E"),
        ("1Ki", 1024 * N, "1Ki"),
        ("1Mi", 1024i128.pow(2) * N, "1Mi"),
        ("1Gi", 1024i128.pow(3) * N, "1Gi"),
        ("1Ti", 1024i128.pow(4) * N, "1Ti"),
        ("1Pi", 1024i128.pow(5) * N, "1Pi"),
        ("1Ei", 1024i128.pow(6) * N, "1Ei"),
        // Decimal forms canonicalise to a multiple-of-three exponent.
        ("6000", 6_000 * N, "6k"),
        ("1000m", N, "1"),
        ("100m", N / 10, "100m"),
        ("0.1", N / 10, "100m"),
        (".5", N / 2, "500m"),
        ("1.", N, "1"),
        ("1.5", 3 * N / 2, "1500m"),
        ("2.5k", 2_500 * N, "2500"),
        ("1024", 1024 * N, "1024"),
        ("+5", 5 * N, "5"),
        ("-100m", -N / 10, "-100m"),
        ("500m", N / 2, "500m"),
        // Binary forms stay binary when whole and at least 1Ki.
        ("1.5Gi", 1536 * 1024i128.pow(2) * N, "1536Mi"),
        ("0.5Gi", 512 * 1024i128.pow(2) * N, "512Mi"),
        ("0.5Ki", 512 * N, "512"),
        ("1025Ki", 1025 * 1024 * N, "1025Ki"),
        ("12Ti", 12 * 1024i128.pow(4) * N, "12Ti"),
        ("-1Ki", -1024 * N, "-1Ki"),
        ("0.001Ki", 1_024_000_000, "1024m"),
        // Exponents, either case, signed.
        ("1e3", 1_000 * N, "1e3"),
        ("1E3", 1_000 * N, "1e3"),
        ("1e+3", 1_000 * N, "1e3"),
        ("1e-3", N / 1000, "1e-3"),
        ("1e9", 10i128.pow(9) * N, "1e9"),
        ("1.5e3", 1_500 * N, "1500"),
        ("1E", 10i128.pow(18) * N, "1E"),
        // Below a nano-unit: rounded up, away from zero.
        ("0.1n", 1, "1n"),
        ("1.5n", 2, "2n"),
        ("-1.5n", -2, "-2n"),
        ("0.0000000000000000000000000000001", 1, "1n"),
        ("1e-30", 1, "1e-9"),
        ("0.0000000001Ki", 103, "103n"),
        // Capped at 2^63-1 base units.
        (
            "9223372036854775807",
            i64::MAX as i128 * N,
            "9223372036854775807",
        ),
        (
            "9223372036854775808",
            i64::MAX as i128 * N,
            "9223372036854775807",
        ),
        (
            "100000000000000000000000000000000000000000",
            MAX_NANOS,
            "9223372036854775807",
        ),
        ("8Ei", MAX_NANOS, "9223372036854775807"),
        ("1e2000000000", MAX_NANOS, "9223372036854775807"),
        ("-9223372036854775808", -MAX_NANOS, "-9223372036854775807"),
    ];
    for &(text, nanos, canonical) in cases {
        let quantity = Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(quantity.nanos(), nanos, "{text}");
        assert_eq!(quantity.canonical(), canonical, "{text}");
        // The canonical form reads back as the same amount.
        assert_eq!(Quantity::parse(canonical).unwrap(), quantity, "{text}");
    }
}

#[test]
fn garbage_is_refused() {
    for text in [
        "",
        " 1",
        "1 ",
        ".",
        "-",
        "+",
        "1.1.M",
        "1+1.0M",
        "0.1mi",
        "0.1am",
        "aoeu",
        ".5i",
        "1i",
        "-3.01i",
        "-3.01e-",
        "1e",
        "1e1.5",
        "1x",
        "Gi",
        "12TB",
        "1K",
        "1KI",
        "1 Gi",
        "--1",
        "1e99999999999",
        "0x10",
        "1_000",
        "١",
    ] {
        assert_eq!(
            Quantity::parse(text),
            Err(QuantityError::Syntax { text: text.into() }),
            "{text:?}"
        );
    }
}

#[test]
fn equal_amounts_compare_equal_whatever_their_form() {
    let q = |text| Quantity::parse(text).unwrap();
    assert_eq!(q("1Gi"), q("1073741824"));
    assert_eq!(q("0.1"), q("100m"));
    assert_eq!(q("1e3"), q("1k"));
    assert!(q("1Gi") > q("1G"));
    assert!(q("999m") < q("1"));
    // Where floats drift: ten times 100m is exactly 1.
    let ten = (0..10).fold(q("0"), |sum, _| sum.plus(q("100m")));
    assert_eq!(ten, q("1"));
    assert_ne!(
        (0..10).map(|_| 0.1f64).sum::<f64>(),
        1.0,
        "floats would not say so"
    );
}

#[test]
fn whole_and_milli_values_round_up_like_the_apiserver() {
    let q = |text| Quantity::parse(text).unwrap();
    assert_eq!(q("1500m").value_ceil(), 2);
    assert_eq!(q("2").value_ceil(), 2);
    assert_eq!(q("-1500m").value_ceil(), -1);
    assert_eq!(q("1n").milli_ceil(), 1);
    assert_eq!(q("1.5").milli_ceil(), 1500);
    assert_eq!(q("12Gi").as_f64(), 12.0 * 1024.0 * 1024.0 * 1024.0);
}

#[test]
fn amounts_as_floats_for_the_callers_that_need_them() {
    assert_eq!(parse("500m").unwrap(), 0.5);
    assert_eq!(parse("2").unwrap(), 2.0);
    assert_eq!(parse("1.5").unwrap(), 1.5);
    assert_eq!(gib(parse("512Mi").unwrap()), 0.5);
    assert_eq!(parse("1G").unwrap(), 1e9);
    assert_eq!(parse("1e9").unwrap(), 1e9);
    assert_eq!(gib(parse("4Gi").unwrap()), 4.0);
    assert_eq!(
        parse("-1"),
        Err(QuantityError::Negative { text: "-1".into() })
    );
    assert_eq!(
        parse("lots").unwrap_err().to_string(),
        "\"lots\" is not a Kubernetes quantity"
    );
    for (text, amount) in [
        ("6000", true),
        ("12Ti", true),
        ("-1", false),
        ("12TB", false),
    ] {
        assert_eq!(is_amount(text), amount, "{text}");
    }
}
