// The harness's main job: read Documents/job.json, run the sweep with Core ML, write
// results.json atomically, then the done marker (with the results' SHA-256).
import CryptoKit
import Foundation
import os

public final class HarnessLog: @unchecked Sendable {
    private let url: URL
    private let logger = Logger(subsystem: "dev.decodebench.harness", category: "run")
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

@available(iOS 18.0, macOS 15.0, *)
public struct Harness {
    public let documents: URL
    public let log: HarnessLog

    public init(documents: URL) {
        self.documents = documents
        self.log = HarnessLog(documents: documents)
    }

    /// Run the job named by `--job` (default job.json); always ends with a done marker.
    public func run(jobFile: String = HarnessFiles.job) async {
        var runId = -1
        do {
            let job = try JSONDecoder().decode(HarnessJob.self, from: Data(contentsOf: documents.appendingPathComponent(jobFile)))
            runId = job.runId
            let result = try await measure(job)
            let data = try JSONEncoder().encode(result)
            try atomicWrite(data, to: HarnessFiles.results)
            let digest = SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
            try writeDone(DoneMarker(runId: runId, ok: true, resultsSha256: digest, error: nil))
            log("run \(runId): done")
        } catch {
            log("run \(runId): failed: \(error)")
            try? writeDone(DoneMarker(runId: runId, ok: false, resultsSha256: nil, error: "\(error)"))
        }
    }

    func measure(_ job: HarnessJob) async throws -> RunResult {
        let package = documents.appendingPathComponent(job.packagePath)
        let complete = package.deletingLastPathComponent().appendingPathComponent(HarnessFiles.completeMarker)
        guard FileManager.default.fileExists(atPath: complete.path) else {
            throw HarnessError.missingPackage(job.packagePath)
        }
        guard let first = job.prompts.first?.tokenIds.first else { throw HarnessError.badJob("no prompts") }
        let thermalStart = DeviceMetrics.thermalState()
        log("run \(job.runId): compiling \(job.packagePath)")
        let (loaded, load) = try await CoreMLEngine.load(package: package, context: job.contextTokens)
        var engine = loaded
        var peak = DeviceMetrics.footprint().peak
        try warmUp(&engine, token: first, steps: job.warmupSteps)
        var prompts: [PromptResult] = []
        for prompt in job.prompts {
            guard prompt.tokenIds.count + job.decodeTokens - 1 <= job.contextTokens else {
                throw HarnessError.badJob("prompt \(prompt.index) does not fit the context")
            }
            prompts.append(try runPrompt(&engine, prompt: prompt, decodeTokens: job.decodeTokens))
            peak = max(peak, DeviceMetrics.footprint().peak)
        }
        return RunResult(
            deviceUdid: job.deviceUdid,
            deviceClass: job.deviceClass,
            productType: DeviceMetrics.productType(),
            osVersion: DeviceMetrics.osVersion(),
            driver: job.driver,
            loadTimeColdMs: load.coldMs,
            loadTimeWarmMs: load.warmMs,
            peakMemoryBytes: Int(peak),
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
