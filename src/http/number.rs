//! Number writers for the hot path: unsigned integers in decimal and in fixed-width hex,
//! appended straight to a byte buffer, with no `format!` and no intermediate `String`.
//!
//! Output is exactly what `{n}` and `{n:016x}` print. Shared by the response heads
//! ([`super::response`]: status code, `Content-Length`) and the API's JSON writer
//! (`api::json_out`, which re-exports them).

/// Lower-case hex digits, by value.
pub const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends the decimal digits of `n`.
#[inline]
pub fn uint(out: &mut Vec<u8>, n: u64) {
    if n < 10 {
        out.push(b'0' + n as u8); // indexes and small counts: the usual case
        return;
    }
    let mut buf = [0u8; 20];
    let digits = decimal(&mut buf, n);
    out.extend_from_slice(digits);
}

/// "00" to "99": two digits per division (a ten-digit Unix time takes five).
static DIGIT_PAIRS: [[u8; 2]; 100] = {
    let mut t = [[0u8; 2]; 100];
    let mut i = 0;
    while i < 100 {
        t[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
        i += 1;
    }
    t
};

/// Writes `n` in decimal at the end of `buf`; returns the digits.
#[inline]
pub fn decimal(buf: &mut [u8; 20], mut n: u64) -> &[u8] {
    let mut at = buf.len();
    while n >= 100 {
        let pair = DIGIT_PAIRS[(n % 100) as usize];
        n /= 100;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&pair);
    }
    if n >= 10 {
        at -= 2;
        buf[at..at + 2].copy_from_slice(&DIGIT_PAIRS[n as usize]);
    } else {
        at -= 1;
        buf[at] = b'0' + n as u8;
    }
    &buf[at..]
}

/// Appends `n` as exactly 16 lower-case hex digits (zero-padded), like `{n:016x}`.
#[inline]
pub fn hex16(out: &mut Vec<u8>, n: u64) {
    let mut buf = [0u8; 16];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = HEX_DIGITS[((n >> (60 - 4 * i)) & 0xf) as usize];
    }
    out.extend_from_slice(&buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_and_hex_match_std_formatting() {
        for n in [
            0u64,
            1,
            9,
            10,
            99,
            100,
            12345,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            uint(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
            let mut out = Vec::new();
            hex16(&mut out, n);
            assert_eq!(out, format!("{n:016x}").into_bytes());
        }
    }
}
