//! Where the agent runs. Every message of the run driver and the inner layer is worded from
//! the [`Place`], so a pod run's errors name the pod without rewriting a VM's text.

use sandbox_core::BackendKind;

/// Where the agent runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// In a microVM, reached over a virtio-serial port.
    Vm,
    /// In a cluster pod, reached over an exec stream.
    Pod,
}

impl Place {
    /// The backend that runs the agent here.
    pub fn backend(self) -> BackendKind {
        match self {
            Place::Vm => BackendKind::Microvm,
            Place::Pod => BackendKind::Cluster,
        }
    }

    /// The agent, as messages name it: `the guest agent`, `the pod's agent`.
    pub fn agent(self) -> &'static str {
        match self {
            Place::Vm => "the guest agent",
            Place::Pod => "the pod's agent",
        }
    }

    /// The place itself, as messages name it: `the guest`, `the pod`.
    pub fn name(self) -> &'static str {
        match self {
            Place::Vm => "the guest",
            Place::Pod => "the pod",
        }
    }

    /// The prefix of receipt lines from the layer inside: `in the guest`, `in the pod`.
    pub fn inside(self) -> &'static str {
        match self {
            Place::Vm => "in the guest",
            Place::Pod => "in the pod",
        }
    }

    /// The carrier ending while the run was going: `the VMM exited`, `the exec stream ended`.
    pub fn carrier_gone(self) -> &'static str {
        match self {
            Place::Vm => "the VMM exited",
            Place::Pod => "the exec stream ended",
        }
    }

    /// The far end closing the channel: `the VM closed the agent channel`, `the exec stream
    /// closed`.
    pub fn channel_closed(self) -> &'static str {
        match self {
            Place::Vm => "the VM closed the agent channel",
            Place::Pod => "the exec stream closed",
        }
    }

    /// `message` prefixed with the backend's name (`microvm: …`, `cluster: …`).
    pub fn say(self, message: impl std::fmt::Display) -> String {
        format!("{}: {message}", self.backend())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_run_is_worded_for_the_pod_and_a_vm_run_for_the_guest() {
        assert_eq!(
            Place::Vm.say(format!("{} refused the run", Place::Vm.agent())),
            "microvm: the guest agent refused the run"
        );
        assert_eq!(
            Place::Pod.say(format!("{} refused the run", Place::Pod.agent())),
            "cluster: the pod's agent refused the run"
        );
        assert_eq!(Place::Pod.inside(), "in the pod");
        assert_eq!(Place::Vm.inside(), "in the guest");
    }
}
