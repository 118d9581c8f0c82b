// What the harness reports about the device: memory footprint (task_info), thermal state,
// Low Power Mode, product type and OS version.
//
// Memory, one definition on every side (decodebench/harness.py): `peak_memory_bytes` is the
// largest phys_footprint sampled after every step of the timed prompts (decode-time memory);
// `compile_peak_memory_bytes` is the lifetime footprint peak once compilation and loads are done.
import Foundation

public enum DeviceMetrics {
    /// The process's physical footprint now and its lifetime peak, in bytes (what jetsam counts).
    /// `mach_task_self_` is a C global: this file relies on Swift 5 language mode (Package.swift).
    public static func footprint() -> (current: UInt64, lifetimePeak: UInt64) {
        var info = task_vm_info_data_t()
        var count = mach_msg_type_number_t(MemoryLayout<task_vm_info_data_t>.size / MemoryLayout<integer_t>.size)
        let result = withUnsafeMutablePointer(to: &info) { pointer in
            pointer.withMemoryRebound(to: integer_t.self, capacity: Int(count)) {
                task_info(mach_task_self_, task_flavor_t(TASK_VM_INFO), $0, &count)
            }
        }
        guard result == KERN_SUCCESS else { return (0, 0) }
        return (info.phys_footprint, max(info.phys_footprint, UInt64(max(0, info.ledger_phys_footprint_peak))))
    }

    public static func thermalState() -> ThermalState {
        ThermalState(ProcessInfo.processInfo.thermalState)
    }

    public static func lowPowerMode() -> Bool {
        ProcessInfo.processInfo.isLowPowerModeEnabled
    }

    /// e.g. "iPhone17,1"
    public static func productType() -> String {
        var system = utsname()
        uname(&system)
        return withUnsafeBytes(of: &system.machine) { bytes in
            String(decoding: bytes.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
    }

    public static func osVersion() -> String {
        let version = ProcessInfo.processInfo.operatingSystemVersion
        return "\(version.majorVersion).\(version.minorVersion).\(version.patchVersion)"
    }

    /// Wait until the thermal state is nominal, at most `limitS` seconds, checking `interruption`
    /// every `pollS`; returns the milliseconds waited.
    public static func waitForNominal(limitS: Double, pollS: Double = 1.0, interruption: Interruption) async throws -> Double {
        let started = MonotonicClock.now()
        let limitNs = UInt64(max(0, limitS) * 1e9)
        while thermalState() != .nominal && MonotonicClock.now() - started < limitNs {
            try interruption.check()
            try await Task.sleep(nanoseconds: UInt64(pollS * 1e9))
        }
        return Double(MonotonicClock.now() - started) / 1e6
    }
}

/// Set from the main thread when the app leaves the foreground; checked by the sweep between
/// steps. Sticky: one interruption spoils the run.
public final class Interruption: @unchecked Sendable {
    private let lock = NSLock()
    private var why: String?

    public init() {}

    public func interrupt(_ reason: String) {
        lock.lock()
        defer { lock.unlock() }
        if why == nil { why = reason }
    }

    public var reason: String? {
        lock.lock()
        defer { lock.unlock() }
        return why
    }

    public func check() throws {
        if let reason = reason { throw HarnessError.interrupted(reason) }
    }
}

/// The sweep's observer on the phone: interruption checks, footprint samples after every step,
/// the thermal state after every prompt.
public final class DeviceObserver: SweepObserver {
    public let interruption: Interruption
    public private(set) var decodePeakBytes: UInt64 = 0
    public private(set) var thermalSamples: [ThermalState] = []

    public init(interruption: Interruption) {
        self.interruption = interruption
    }

    public func afterStep() throws {
        decodePeakBytes = max(decodePeakBytes, DeviceMetrics.footprint().current)
        try interruption.check()
    }

    public func afterPrompt(_ result: PromptResult) -> PromptResult {
        thermalSamples.append(DeviceMetrics.thermalState())
        return result
    }
}
