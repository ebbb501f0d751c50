//! DCQCN at work, drawn: two ConnectX-like senders share a 10 Gb/s link
//! whose switch queue marks ECN (RED: Kmin 40 KB, Kmax 160 KB, Pmax 0.2).
//! Flow 0 starts alone; flow 1 (50 µs further away) joins at 10 ms and
//! leaves at 60 ms. The SVG shows each QP's DCQCN rate (solid), its
//! measured throughput (thin), the CNPs each QP received (ticks), and the
//! bottleneck queue.
//!
//! Run: `cargo run --release -p rxe-core --example dcqcn_plot [-- --out docs/dcqcn.svg --ms 120 --seed 1]`

use std::fmt::Write as _;
use std::time::Duration;

use rxe_core::cc::{CcConfig, CcModel, CcParams};
use rxe_core::sim::{Bottleneck, Dumbbell, DumbbellOpts, LinkConfig, Sample};
use rxe_core::Instant;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const W: f64 = 900.0;
const H: f64 = 560.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 90.0;
/// The rate plot: TOP .. RATE_BOTTOM; CNP ticks below; then the queue.
const RATE_BOTTOM: f64 = 340.0;
const TICKS: f64 = 360.0;
const QUEUE_TOP: f64 = 420.0;
const QUEUE_BOTTOM: f64 = 520.0;
const COLORS: [&str; 2] = ["#1f77b4", "#d62728"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out: String = arg("--out", "dcqcn.svg".to_string());
    let ms: u64 = arg("--ms", 120);
    let seed: u64 = arg("--seed", 1);
    let mut params = CcParams::default();
    params.set("line_rate_mbps", 10_000)?;
    let opts = DumbbellOpts {
        cc: CcConfig {
            model: CcModel::Mlx5Like,
            params,
        },
        bottleneck: Bottleneck {
            rate_mbps: 10_000,
            buffer_bytes: 4_000_000,
            kmin_bytes: 40_000,
            kmax_bytes: 160_000,
            pmax: 0.2,
        },
        link: LinkConfig {
            delay: Duration::from_micros(4),
            ..LinkConfig::perfect()
        },
        sender_delay: vec![Duration::ZERO, Duration::from_micros(50)],
        active: vec![
            (Duration::ZERO, None),
            (Duration::from_millis(10), Some(Duration::from_millis(60))),
        ],
        mtu: rxe_core::Mtu::M4096,
        msg_len: 64 * 1024,
        depth: 8,
        seed,
    };
    let mut d = Dumbbell::new(opts)?;
    let samples = d.run(
        Instant::from_nanos(ms * 1_000_000),
        Duration::from_micros(250),
    )?;
    let trace = d.trace();
    let cnps: Vec<Vec<Instant>> = trace.iter().map(|t| t.cnps.clone()).collect();
    std::fs::write(&out, svg(&samples, &cnps, ms))?;
    for (i, t) in trace.iter().enumerate() {
        println!(
            "flow {i}: {} data packets ({} ECT(0)), {} CNPs received",
            t.data_packets,
            t.ect0_packets,
            t.cnps.len()
        );
    }
    let s = d.net.stats();
    println!(
        "bottleneck: {} packets marked CE, {} dropped; wrote {out}",
        s.ce_marked, s.queue_dropped
    );
    Ok(())
}

fn x(t: Instant, ms: u64) -> f64 {
    LEFT + (W - LEFT - RIGHT) * t.as_nanos() as f64 / (ms as f64 * 1e6)
}

fn y_rate(bps: f64) -> f64 {
    RATE_BOTTOM - (RATE_BOTTOM - TOP) * (bps / 10e9).min(1.05)
}

fn y_queue(bytes: f64, max: f64) -> f64 {
    QUEUE_BOTTOM - (QUEUE_BOTTOM - QUEUE_TOP) * bytes / max
}

fn polyline(
    points: impl Iterator<Item = (f64, f64)>,
    color: &str,
    width: f64,
    dash: &str,
) -> String {
    let pts: Vec<String> = points.map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
    format!(
        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" {dash} points=\"{}\"/>\n",
        pts.join(" ")
    )
}

fn svg(s: &[Sample], cnps: &[Vec<Instant>], ms: u64) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let _ = writeln!(
        o,
        "<text x=\"{LEFT}\" y=\"22\" font-size=\"15\">DCQCN (rxe-emu, ConnectX-like model): two QPs share a 10 Gb/s ECN-marking bottleneck</text>\n\
         <text x=\"{LEFT}\" y=\"40\" fill=\"#555\">flow 1 joins at 10 ms and leaves at 60 ms; NVIDIA default DCQCN parameters; RED Kmin 40 KB, Kmax 160 KB, Pmax 0.2</text>"
    );
    // Axes and grid.
    for g in 0..=5 {
        let bps = g as f64 * 2e9;
        let yy = y_rate(bps);
        let _ = writeln!(
            o,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{} Gb/s</text>",
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            g * 2
        );
    }
    let step = if ms > 60 { 20 } else { 10 };
    for t in (0..=ms).step_by(step as usize) {
        let xx = x(Instant::from_nanos(t * 1_000_000), ms);
        let _ = writeln!(
            o,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{TOP}\" y2=\"{QUEUE_BOTTOM}\" stroke=\"#eee\"/>\
             <text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t} ms</text>",
            QUEUE_BOTTOM + 16.0
        );
    }
    // Rates and throughput.
    for (i, color) in COLORS.iter().enumerate() {
        let thr = s.iter().map(|p| (x(p.t, ms), y_rate(p.throughput_bps[i])));
        o += &polyline(thr, color, 0.8, "stroke-opacity=\"0.45\"");
        let rate = s.iter().map(|p| (x(p.t, ms), y_rate(p.rate_bps[i] as f64)));
        o += &polyline(rate, color, 2.0, "");
        // CNP ticks: a short line where the QP received CNPs (one per
        // pixel column, so thousands of CNPs stay a small file).
        let mut columns: Vec<i64> = cnps[i].iter().map(|t| x(*t, ms).round() as i64).collect();
        columns.dedup();
        for xx in columns {
            let y0 = TICKS + i as f64 * 14.0;
            let _ = writeln!(
                o,
                "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{y0:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"0.5\"/>",
                y0 + 10.0
            );
        }
        let _ = writeln!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{color}\">CNPs to flow {i}</text>",
            LEFT - 6.0,
            TICKS + i as f64 * 14.0 + 9.0
        );
    }
    // The queue.
    let qmax = s.iter().map(|p| p.queued_bytes).max().unwrap_or(1).max(1) as f64;
    o += &polyline(
        s.iter()
            .map(|p| (x(p.t, ms), y_queue(p.queued_bytes as f64, qmax))),
        "#2ca02c",
        1.2,
        "",
    );
    let _ = writeln!(
        o,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#2ca02c\">queue</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#2ca02c\">{:.0} KB</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#2ca02c\">0</text>",
        LEFT - 6.0,
        (QUEUE_TOP + QUEUE_BOTTOM) / 2.0,
        LEFT - 6.0,
        QUEUE_TOP + 4.0,
        qmax / 1000.0,
        LEFT - 6.0,
        QUEUE_BOTTOM
    );
    // Legend.
    let lx = LEFT;
    for (i, color) in COLORS.iter().enumerate() {
        let ly = 58.0 + i as f64 * 16.0;
        let _ = writeln!(
            o,
            "<line x1=\"{lx}\" x2=\"{:.1}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"2\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">flow {i}: the sending QP's DCQCN rate RC (thin: its measured throughput)</text>",
            lx + 24.0,
            lx + 30.0,
            ly + 4.0
        );
    }
    o += "</svg>\n";
    o
}
