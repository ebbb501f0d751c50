//! The CM's time arithmetic, as kernel `cm.c` does it.

use std::time::Duration;

/// Kernel `cm_convert_to_ms`: an IBTA time exponent (4.096 µs × 2^t) as
/// milliseconds, approximated the kernel's way: `1 << max(t - 8, 0)`
/// (2^8 × 4.096 µs ≈ 1 ms). Exponents above 31 are clamped to 31, as the
/// 5-bit fields cannot hold more.
pub const fn cm_convert_to_ms(iba_time: u8) -> u64 {
    let t = if iba_time > 31 { 31 } else { iba_time };
    1u64 << t.saturating_sub(8)
}

/// [`cm_convert_to_ms`] as a `Duration`.
pub const fn iba_time(iba_time: u8) -> Duration {
    Duration::from_millis(cm_convert_to_ms(iba_time))
}

/// Kernel `cm_ack_timeout`: the local ACK timeout of a path from the CA's
/// ACK delay and the path's packet life time (IBTA 12.7.34: at least
/// 2 × packet life time + ACK delay, in exponent form), capped at 31.
pub const fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut ack_timeout = packet_life_time as u32 + 1;
    let delay = ca_ack_delay as u32;
    if ack_timeout >= delay {
        ack_timeout += (delay >= ack_timeout - 1) as u32;
    } else {
        ack_timeout = delay + (ack_timeout >= delay.saturating_sub(1)) as u32;
    }
    if ack_timeout > 31 {
        31
    } else {
        ack_timeout as u8
    }
}

/// Kernel rdma_cm's CM response timeout (`CMA_CM_RESPONSE_TIMEOUT`, 20:
/// 4.3 s), sent as both the local and remote CM response timeout of a REQ.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;

/// Kernel rdma_cm's max CM retries (`CMA_MAX_CM_RETRIES`).
pub const CMA_MAX_CM_RETRIES: u8 = 15;

/// The packet life time kernel rdma_cm gives a RoCE path
/// (`CMA_IBOE_PACKET_LIFETIME`; 18 in Linux 6.1, as the REQ's local ACK
/// timeout of 19 = `cm_ack_timeout(15, 18)` in rdmacm_rping.pcap shows).
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 18;

/// The ACK delay kernel rxe reports (`RXE_LOCAL_CA_ACK_DELAY`, the
/// device's `local_ca_ack_delay`, 15), which kernel cm puts in the REP's
/// target ACK delay (0x0f in rdmacm_rping.pcap).
pub const RXE_ACK_DELAY: u8 = 15;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convert_to_ms_matches_the_kernel() {
        assert_eq!(cm_convert_to_ms(0), 1);
        assert_eq!(cm_convert_to_ms(8), 1);
        assert_eq!(cm_convert_to_ms(9), 2);
        assert_eq!(cm_convert_to_ms(18), 1024);
        assert_eq!(cm_convert_to_ms(19), 2048);
        assert_eq!(cm_convert_to_ms(20), 4096);
        assert_eq!(cm_convert_to_ms(31), 1 << 23);
        assert_eq!(cm_convert_to_ms(200), 1 << 23);
    }

    #[test]
    fn ack_timeout_matches_the_kernel() {
        // The REQ of rdmacm_rping.pcap: rxe ack delay 15, life time 18.
        assert_eq!(cm_ack_timeout(15, 18), 19);
        // ack_timeout (17) < delay (20): delay + (17 >= 19) = 20.
        assert_eq!(cm_ack_timeout(20, 16), 20);
        // ack_timeout (15) < delay (16): 16 + (15 >= 15) = 17.
        assert_eq!(cm_ack_timeout(16, 14), 17);
        // delay == ack_timeout - 1 bumps by one.
        assert_eq!(cm_ack_timeout(15, 15), 17);
        assert_eq!(cm_ack_timeout(0, 31), 31);
        assert_eq!(cm_ack_timeout(31, 31), 31);
    }
}
