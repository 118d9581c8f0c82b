// The harness's main job: read Documents/job.json, run the sweep with the job's engine (Core ML
// for coreml; Core AI for coreai, where the SDK and the phone have it), write results.json
// atomically, then the done marker (with the results' SHA-256). Every way a run can end writes a
// done marker: ok, or ok: false with a FailureReason (interrupted, missing_job, bad_job,
// protocol_version, missing_package, model_error) and a message.
import CryptoKit
import Foundation
import os

public final class HarnessLog: @unchecked Sendable {
    private let url: URL
    private let logger = Logger(subsystem: Bundle.main.bundleIdentifier ?? "dev.decodebench.devices.harness", category: "run")
    private let lock = NSLock()

    public init(documents: URL) { url = documents.appendingPathComponent(HarnessFiles.log) }

    public func callAsFunction(_ message: String) {
        logger.notice("\(message, privacy: .public)")
        let line = "\(ISO8601DateFormatter().string(from: Date())) \(message)\n"
        lock.lock()
        defer { lock.unlock() }
        if let handle = try? FileHandle(forWritingTo: url) {
            handle.seekToEndOfFile()
            handle.write(Data(line.utf8))
            try? handle.close()
        } else {
            try? Data(line.utf8).write(to: url)
        }
    }
}

/// Just the fields that say whose job it is, decoded even when the rest of job.json does not.
struct JobHeader: Decodable {
    let runId: Int?
    let protocolVersion: Int?

    enum CodingKeys: String, CodingKey {
        case runId = "run_id"
        case protocolVersion = "protocol_version"
    }
}

@available(iOS 18.0, macOS 15.0, *)
public struct Harness: Sendable {
    public let documents: URL
    public let log: HarnessLog
    public let interruption: Interruption

    public init(documents: URL, interruption: Interruption = Interruption()) {
        self.documents = documents
        self.log = HarnessLog(documents: documents)
        self.interruption = interruption
    }

    /// The run the agent launched us for (its environment), until job.json says otherwise.
    static func launchRunId() -> Int {
        ProcessInfo.processInfo.environment[HarnessProtocol.runIdEnvironment].flatMap { Int($0) } ?? -1
    }

    /// Run the job named by `--job` (default job.json); always ends with a done marker, also
    /// when the job is missing or unreadable (the agent must not wait for its timeout).
    public func run(jobFile: String = HarnessFiles.job) async {
        var runId = Harness.launchRunId()
        do {
            let url = documents.appendingPathComponent(jobFile)
            guard FileManager.default.fileExists(atPath: url.path) else { throw HarnessError.missingJob(jobFile) }
            let data: Data
            do { data = try Data(contentsOf: url) } catch { throw HarnessError.badJob("cannot read \(jobFile): \(error)") }
            let header = try? JSONDecoder().decode(JobHeader.self, from: data)
            runId = header?.runId ?? runId
            if let version = header?.protocolVersion, version != HarnessProtocol.version {
                throw HarnessError.protocolMismatch("\(jobFile) speaks harness protocol \(version), the harness speaks \(HarnessProtocol.version): install the harness of the agent's release")
            }
            let job: HarnessJob
            do { job = try JSONDecoder().decode(HarnessJob.self, from: data) } catch { throw HarnessError.badJob("\(jobFile) does not decode: \(error)") }
            runId = job.runId
            if let problem = jobProblem(job) { throw HarnessError.badJob(problem) }
            let result = try await measureAndRelease(job)
            let encoded = try JSONEncoder().encode(result)
            try atomicWrite(encoded, to: HarnessFiles.results)
            let digest = SHA256.hash(data: encoded).map { String(format: "%02x", $0) }.joined()
            try writeDone(DoneMarker(runId: runId, ok: true, resultsSha256: digest, error: nil))
            log("run \(runId): done")
        } catch let error as HarnessError {
            fail(runId, error.reason, error.description)
        } catch {
            fail(runId, .model_error, "\(error)")
        }
    }

    func fail(_ runId: Int, _ reason: FailureReason, _ message: String) {
        log("run \(runId): failed (\(reason.rawValue)): \(message)")
        try? writeDone(DoneMarker(runId: runId, ok: false, resultsSha256: nil, error: message, reason: reason))
    }

    /// Measure with the job's engine, then drop what Core AI cached for the package: here,
    /// once `measure` has returned, nothing holds the specialization any more.
    func measureAndRelease(_ job: HarnessJob) async throws -> RunResult {
        defer { releaseSpecializations(job) }
        return try await measure(job)
    }

    func measure(_ job: HarnessJob) async throws -> RunResult {
        let package = documents.appendingPathComponent(job.packagePath)
        let complete = package.deletingLastPathComponent().appendingPathComponent(HarnessFiles.completeMarker)
        guard FileManager.default.fileExists(atPath: complete.path) else {
            throw HarnessError.missingPackage(job.packagePath)
        }
        let lowPowerMode = DeviceMetrics.lowPowerMode()
        if lowPowerMode { log("run \(job.runId): Low Power Mode is on") }
        switch try EngineKind.named(job.engine) {
        case .coreml: return try await measureCoreML(job, package: package, lowPowerMode: lowPowerMode)
        case .coreai: return try await measureCoreAI(job, package: package, lowPowerMode: lowPowerMode)
        }
    }

    func measureCoreML(_ job: HarnessJob, package: URL, lowPowerMode: Bool) async throws -> RunResult {
        log("run \(job.runId): compiling \(job.packagePath)")
        CompiledModels.removeAll()  // what a killed run left behind
        let compileStart = MonotonicClock.now()
        let compiled: URL
        do {
            compiled = try await CompiledModels.compile(package, name: job.artifactSha256)
        } catch {
            throw HarnessError.model("compiling \(job.packagePath) failed: \(error)")
        }
        defer { try? FileManager.default.removeItem(at: compiled) }
        let compileNs = MonotonicClock.now() - compileStart
        let (loaded, load) = try await CoreMLEngine.load(compiled: compiled, compileNs: compileNs, context: job.contextTokens, kv: job.variant?.kv)
        var engine = consume loaded
        log("run \(job.runId): loaded with Core ML (kv=\(engine.kv.rawValue))")
        return try await sweep(&engine, load: load, job: job, lowPowerMode: lowPowerMode)
    }

    /// Core AI where the SDK has it and the phone runs iOS 27; otherwise a model_error saying
    /// which of the two is missing.
    func measureCoreAI(_ job: HarnessJob, package: URL, lowPowerMode: Bool) async throws -> RunResult {
        #if canImport(CoreAI)
        guard #available(iOS 27.0, macOS 27.0, *) else {
            throw HarnessError.model("engine coreai needs Core AI, which needs iOS 27; this phone runs \(DeviceMetrics.osVersion())")
        }
        let units = try ComputeUnits.named(job.computeUnits)
        log("run \(job.runId): specializing \(job.packagePath) with Core AI (compute_units \(units.rawValue))")
        let (loaded, load) = try await CoreAIEngine.load(package: package, context: job.contextTokens, kv: job.variant?.kv, units: units)
        var engine = consume loaded  // no second reference to its NDArrays while it writes them
        log("run \(job.runId): loaded with Core AI (kv=input)")
        return try await sweep(&engine, load: load, job: job, lowPowerMode: lowPowerMode)
        #else
        throw HarnessError.model("engine coreai: this harness was built without Core AI (an SDK before iOS 27); rebuild it with Xcode 27 to decode .aimodel packages")
        #endif
    }

    func releaseSpecializations(_ job: HarnessJob) {
        #if canImport(CoreAI)
        if #available(iOS 27.0, macOS 27.0, *), job.engine == EngineKind.coreai.rawValue {
            CoreAIEngine.forget(documents.appendingPathComponent(job.packagePath))
        }
        #endif
    }

    /// Warm up, wait for a nominal thermal state, then time every prompt: the same for every
    /// engine.
    func sweep<E: StepEngine>(_ engine: inout E, load: LoadTimes, job: HarnessJob, lowPowerMode: Bool) async throws -> RunResult {
        let compilePeak = DeviceMetrics.footprint().lifetimePeak
        let first = job.prompts[0].tokenIds[0]  // jobProblem: prompts and their tokens exist
        log("run \(job.runId): warming up \(job.warmupSteps) steps")
        try interruption.check()
        try await warmUp(&engine, token: first, steps: job.warmupSteps)
        try interruption.check()
        let waitedMs = try await DeviceMetrics.waitForNominal(limitS: job.thermalWaitS ?? HarnessProtocol.defaultThermalWaitS, interruption: interruption)
        let thermalStart = DeviceMetrics.thermalState()
        if thermalStart != .nominal { log("run \(job.runId): still \(thermalStart.rawValue) after \(Int(waitedMs)) ms; measuring anyway") }
        let observer = DeviceObserver(interruption: interruption)
        var prompts: [PromptResult] = []
        for prompt in job.prompts {
            prompts.append(try await runPrompt(&engine, prompt: prompt, decodeTokens: job.decodeTokens, observer: observer))
        }
        try interruption.check()
        return RunResult(
            deviceUdid: job.deviceUdid,
            deviceClass: job.deviceClass,
            productType: DeviceMetrics.productType(),
            osVersion: DeviceMetrics.osVersion(),
            driver: job.driver,
            loadTimeColdMs: load.coldMs,
            loadTimeWarmMs: load.warmMs,
            peakMemoryBytes: Int(observer.decodePeakBytes),
            compilePeakMemoryBytes: Int(compilePeak),
            lowPowerMode: lowPowerMode,
            thermalWaitMs: waitedMs,
            promptThermalStates: observer.thermalSamples,
            thermalStateStart: thermalStart,
            thermalStateEnd: DeviceMetrics.thermalState(),
            prompts: prompts
        )
    }

    /// Write `name.partial`, then rename(2) over `name`: readers see all of it or none.
    func atomicWrite(_ data: Data, to name: String) throws {
        let target = documents.appendingPathComponent(name)
        let partial = documents.appendingPathComponent(name + HarnessFiles.partialSuffix)
        try data.write(to: partial)
        guard rename(partial.path, target.path) == 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: target.path])
        }
    }

    func writeDone(_ marker: DoneMarker) throws {
        try atomicWrite(try JSONEncoder().encode(marker), to: HarnessFiles.done)
    }
}
