//! The guest (through `vm/rxe-vm.sh`), host-side processes in the
//! namespace, and the capture on the bridge.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The bridge `rxe-vm.sh` creates in the namespace.
pub const BRIDGE: &str = "rxc-br";

/// Output of a command.
#[derive(Debug, Clone)]
pub struct Out {
    /// Exit code (-1: killed by a signal).
    pub rc: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// State of a background job in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Still running.
    Running,
    /// Exited with this code.
    Exited(i32),
}

/// Guest 1 and the namespace, as `rxe-vm.sh` set them up.
pub struct Vm {
    /// Path of rxe-vm.sh.
    pub script: PathBuf,
    /// Network namespace name.
    pub netns: String,
}

impl Vm {
    fn run(&self, args: &[&str]) -> Out {
        match Command::new(&self.script)
            .args(args)
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) => Out {
                rc: o.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            },
            Err(e) => Out {
                rc: -1,
                stdout: String::new(),
                stderr: format!("cannot run {}: {e}", self.script.display()),
            },
        }
    }

    /// Run a shell script in the guest (killed there after `timeout_s`).
    pub fn exec(&self, timeout_s: u32, script: &str) -> Out {
        self.run(&["exec", "1", "-t", &timeout_s.to_string(), script])
    }

    /// Start a background job in the guest.
    pub fn bg(&self, name: &str, cmd: &str) -> Out {
        self.run(&["bg", "1", name, cmd])
    }

    /// Is the job still running? `None` if the guest cannot tell.
    pub fn bgstat(&self, name: &str) -> Option<Job> {
        let o = self.run(&["bgstat", "1", name]);
        let s = o.stdout.trim();
        if s == "running" {
            Some(Job::Running)
        } else {
            s.strip_prefix("exited ")
                .and_then(|rc| rc.trim().parse().ok())
                .map(Job::Exited)
        }
    }

    /// The job's log and exit code once it has ended.
    pub fn bgwait(&self, name: &str, secs: u32) -> Out {
        self.run(&["bgwait", "1", name, &secs.to_string()])
    }

    /// Kill the job's process group; its log so far.
    pub fn bgkill(&self, name: &str) -> Out {
        self.run(&["bgkill", "1", name])
    }

    /// Whether something listens on TCP `port` in the guest.
    pub fn guest_listening(&self, port: u16) -> bool {
        let re = format!("^ *[0-9]+: [0-9A-F]+:{port:04X} [0-9A-F]+:0000 0A ");
        self.exec(10, &format!("grep -qE '{re}' /proc/net/tcp /proc/net/tcp6"))
            .rc
            == 0
    }

    /// Whether an rdma_cm id listens on `port` in the guest (kernel
    /// rdma_cm's ids as `rdma resource show cm_id` lists them).
    pub fn guest_cm_listening(&self, port: u16) -> bool {
        let o = self.exec(10, "rdma resource show cm_id");
        o.rc == 0 && crate::cm::guest_listens(&o.stdout, port)
    }

    /// Set the link MTU of bridge, tap and guest eth0.
    pub fn set_mtu(&self, mtu: u32) -> Out {
        self.run(&["mtu", &mtu.to_string()])
    }

    /// netem on guest 1's eth0, both directions (`args` like `loss 5%`, or
    /// `off`), on RoCEv2 packets that carry payload only (`rxe-vm.sh netem
    /// 1 --data`): ACKs and NAKs are never dropped. See `Scenario::loss_pct`.
    pub fn netem(&self, args: &str) -> Out {
        self.run(&["netem", "1", "--data", args])
    }

    /// A command that runs `program` inside the namespace.
    pub fn host_cmd(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).arg(program);
        c
    }

    /// Run a host command inside the namespace and wait for it.
    pub fn host_run(&self, program: &str, args: &[&str]) -> Out {
        match self.host_cmd(Path::new(program)).args(args).output() {
            Ok(o) => Out {
                rc: o.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            },
            Err(e) => Out {
                rc: -1,
                stdout: String::new(),
                stderr: e.to_string(),
            },
        }
    }

    /// Whether something listens on TCP `port` in the namespace.
    pub fn host_listening(&self, port: u16) -> bool {
        let o = self.host_run("ss", &["-Hltn", &format!("sport = :{port}")]);
        o.rc == 0 && !o.stdout.trim().is_empty()
    }
}

/// A process started by us, to be ended by its id.
pub struct Proc {
    child: Child,
}

impl Proc {
    /// Start `cmd` with its stdout and stderr going to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> std::io::Result<Proc> {
        let f = File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()?;
        Ok(Proc { child })
    }

    /// Exit code if it has ended (-1 for a signal).
    pub fn poll(&mut self) -> Option<i32> {
        match self.child.try_wait() {
            Ok(Some(st)) => Some(st.code().unwrap_or(-1)),
            Ok(None) => None,
            Err(_) => Some(-1),
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after `grace` if it is still there.
    pub fn terminate(&mut self, grace: Duration) {
        if self.poll().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < grace {
            if self.poll().is_some() {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.poll().is_none() {
            self.kill();
        }
    }
}

/// dumpcap on the bridge, RoCEv2 only.
pub struct Capture {
    proc: Proc,
    log: PathBuf,
}

impl Capture {
    /// Start capturing to `pcap` (classic pcap); waits until dumpcap
    /// reports that it captures.
    pub fn start(vm: &Vm, pcap: &Path, log: &Path) -> Result<Capture, String> {
        let mut cmd = vm.host_cmd(Path::new("dumpcap"));
        cmd.args([
            "-q",
            "-P",
            "-B",
            "64",
            "-i",
            BRIDGE,
            "-f",
            "udp port 4791",
            "-w",
        ])
        .arg(pcap);
        let mut proc = Proc::spawn(cmd, log).map_err(|e| format!("dumpcap: {e}"))?;
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text.contains("Capturing on") {
                return Ok(Capture {
                    proc,
                    log: log.to_path_buf(),
                });
            }
            if proc.poll().is_some() || t0.elapsed() > Duration::from_secs(10) {
                proc.kill();
                return Err(format!("dumpcap did not start: {}", text.trim()));
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Stop (SIGTERM: dumpcap flushes and closes the file); dumpcap's
    /// closing words (packets captured/dropped).
    pub fn stop(mut self) -> String {
        // let the last packets reach the socket
        sleep(Duration::from_millis(300));
        self.proc.terminate(Duration::from_secs(5));
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
