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
    buf[..8].copy_from_slice(&hex8(n >> 32));
    buf[8..].copy_from_slice(&hex8(n & 0xffff_ffff));
    out.extend_from_slice(&buf);
}

/// The low 32 bits of `x` as eight hex digits, all at once: each nibble spread into a byte
/// of its own, then `'0'` added, and 39 more (`'a' - '0' - 10`) to the bytes of 10 and over.
/// (The digit-by-digit table lookup was ~69 instructions a response id.)
fn hex8(x: u64) -> [u8; 8] {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    let x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    let x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // Byte k (from the low end) now holds nibble k: the first digit is the high byte.
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    (x + b'0' as u64 * ONES + letters * 39).to_be_bytes()
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

    #[test]
    fn hex_matches_std_formatting_for_every_digit_in_every_place() {
        let mut x = 0x0123_4567_89ab_cdefu64;
        for _ in 0..64 {
            for n in [
                x,
                !x,
                x.rotate_left(4),
                x.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ] {
                let mut out = Vec::new();
                hex16(&mut out, n);
                assert_eq!(out, format!("{n:016x}").into_bytes());
            }
            x = x.rotate_left(1) ^ 0xf0f0;
        }
    }
}
