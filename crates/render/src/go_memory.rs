//! `GOMEMLIMIT` for the tailscale container: a soft limit for the Go runtime below the
//! container's memory limit, so that tailscaled collects garbage harder as it nears the limit
//! instead of being OOM-killed (a burst of short egress connections grows its netstack to
//! 250–350 MiB, over the default 256 Mi limit; docs/benchmarks.md "Agent pod memory").

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The share of the container's memory limit given to the Go runtime (the rest: the mapped
/// binary, ~15–30 MiB, and headroom).
const PERCENT_OF_LIMIT: u64 = 90;
const MIB: u64 = 1024 * 1024;

/// `GOMEMLIMIT` for a container whose memory limit is `limit`: 90 % of it, in MiB (bytes
/// below 1 MiB). `None` when the quantity cannot be read (the apiserver validates it; a
/// form this parser does not know just leaves the Go runtime's default).
pub fn go_memory_limit(limit: &Quantity) -> Option<String> {
    let bytes = quantity_bytes(&limit.0)?;
    let soft = u64::try_from(bytes.saturating_mul(u128::from(PERCENT_OF_LIMIT)) / 100).ok()?;
    if soft == 0 {
        return None;
    }
    Some(if soft >= MIB {
        format!("{}MiB", soft / MIB)
    } else {
        soft.to_string()
    })
}

/// Bytes of a Kubernetes quantity in the forms a memory limit takes: an integer or decimal
/// number with an optional binary (`Ki` … `Ei`) or decimal (`k`, `M` … `E`) suffix, or an
/// `e`/`E` exponent. Fractions of a byte are dropped; negative values and other suffixes
/// (`m`, `n`, `u`) give `None`.
fn quantity_bytes(text: &str) -> Option<u128> {
    let text = text.trim();
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (multiplier, exponent): (u128, u32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        exp if exp.starts_with(['e', 'E']) => (1, exp[1..].parse::<u32>().ok()?),
        _ => return None,
    };
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    // value = digits / 10^fraction_len * 10^exponent * multiplier, in integers.
    let digits: u128 = format!("{whole}{fraction}").parse().ok()?;
    let scale = u32::try_from(fraction.len()).ok()?;
    let mut value = digits.checked_mul(multiplier)?;
    if exponent >= scale {
        value = value.checked_mul(10u128.checked_pow(exponent - scale)?)?;
    } else {
        value /= 10u128.checked_pow(scale - exponent)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(text: &str) -> Option<String> {
        go_memory_limit(&Quantity(text.to_string()))
    }

    #[test]
    fn binary_suffixes_give_ninety_percent_in_mib() {
        assert_eq!(limit("256Mi").as_deref(), Some("230MiB"));
        assert_eq!(limit("512Mi").as_deref(), Some("460MiB"));
        assert_eq!(limit("1Gi").as_deref(), Some("921MiB"));
        assert_eq!(limit("1048576Ki").as_deref(), Some("921MiB"));
    }

    #[test]
    fn decimal_suffixes_exponents_and_fractions() {
        // 500 MB = 500,000,000 bytes; 90 % = 450,000,000 bytes = 429.15 MiB
        assert_eq!(limit("500M").as_deref(), Some("429MiB"));
        assert_eq!(limit("5e8").as_deref(), Some("429MiB"));
        assert_eq!(limit("0.5G").as_deref(), Some("429MiB"));
        assert_eq!(limit("1.5Gi").as_deref(), Some("1382MiB"));
        assert_eq!(limit("268435456").as_deref(), Some("230MiB"));
        assert_eq!(limit("+256Mi").as_deref(), Some("230MiB"));
    }

    #[test]
    fn tiny_limits_in_bytes() {
        assert_eq!(limit("1000").as_deref(), Some("900"));
        assert_eq!(limit("1Ki").as_deref(), Some("921"));
    }

    #[test]
    fn unreadable_or_zero_limits_leave_the_default() {
        for text in [
            "", "Mi", "abc", "-1Gi", "100m", "1Zi", "1.2.3Gi", "0", "1e", "1e99999",
        ] {
            assert_eq!(limit(text), None, "{text:?}");
        }
    }

    #[test]
    fn huge_limits_do_not_overflow() {
        assert_eq!(limit("8Ei").as_deref(), Some("7916483719987MiB"));
        assert_eq!(limit("99999999999999999999Ei"), None);
    }
}
