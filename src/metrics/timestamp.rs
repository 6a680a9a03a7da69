//! RFC 3339 UTC timestamps from Unix milliseconds, for the JSON export (no date crate).
//!
//! The caller passes the wall-clock time in: nothing here reads a clock. Runs on io threads
//! and allocates the returned string; never called on the engine thread.

/// Milliseconds in a day.
const MS_PER_DAY: u64 = 86_400_000;

/// `unix_ms` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (years past 9999 get more digits).
pub fn rfc3339_utc_from_unix_ms(unix_ms: u64) -> String {
    let days = unix_ms / MS_PER_DAY;
    let ms_of_day = unix_ms % MS_PER_DAY;
    let (year, month, day) = civil_from_days(days);
    let (hour, minute) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (second, milli) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z")
}

/// Proleptic Gregorian (year, month 1..=12, day 1..=31) of `days` since 1970-01-01.
///
/// Howard Hinnant's `civil_from_days`, restricted to dates on or after the epoch: shift the
/// epoch to 0000-03-01 so leap days fall at the end of a year, then split into 400-year eras.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = z / 146_097; // days per 400-year era
    let day_of_era = z - era * 146_097; // 0..=146_096
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153; // 0..=11, March = 0
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    debug_assert!((1..=12).contains(&month) && (1..=31).contains(&day));
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339_utc_from_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_utc_from_unix_ms(951_782_400_000),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339_utc_from_unix_ms(1_700_000_000_123),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            rfc3339_utc_from_unix_ms(4_107_542_399_999),
            "2100-02-28T23:59:59.999Z"
        );
    }

    #[test]
    fn every_day_of_four_centuries_matches_a_naive_calendar() {
        let is_leap = |y: u64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let month_days = |y: u64, m: u64| match m {
            2 if is_leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let (mut y, mut m, mut d) = (1970, 1, 1);
        for days in 0..146_097 + 366 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            d += 1;
            if d > month_days(y, m) {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
