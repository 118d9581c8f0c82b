import CoreML
import Foundation
import XCTest

@testable import HarnessKit

final class ProtocolTests: XCTestCase {
    static let jobJSON = """
    {"protocol_version": 1, "run_id": 7, "model": "tiny-gqa", "variant_label": "folded",
     "device_class": "iphone-17-pro", "device_udid": "00008150-0001", "driver": "pymobiledevice3",
     "artifact_sha256": "ab", "package_path": "models/ab/model.mlpackage", "bytes_per_token": 10,
     "context_tokens": 128, "decode_tokens": 4, "warmup_steps": 2, "thermal_wait_s": 60,
     "prompt_set_version": "builtin-v1",
     "variant": {"attention": "folded", "kv": "input", "context": 128, "quant": "fp16"},
     "prompts": [{"index": 0, "token_ids": [1, 2, 3]}]}
    """

    func decodeJob(_ json: String = jobJSON) throws -> HarnessJob {
        try JSONDecoder().decode(HarnessJob.self, from: Data(json.utf8))
    }

    func testAJobFromTheAgentDecodes() throws {
        let job = try decodeJob()
        XCTAssertEqual(job.runId, 7)
        XCTAssertEqual(job.prompts[0].tokenIds, [1, 2, 3])
        XCTAssertEqual(job.variant?.kv, .input)
        XCTAssertNil(jobProblem(job))
    }

    func testJobsThatOverrunTheContextAreRefused() throws {
        let warm = try decodeJob(Self.jobJSON.replacingOccurrences(of: "\"warmup_steps\": 2", with: "\"warmup_steps\": 129"))
        XCTAssertTrue(jobProblem(warm)!.contains("warmup_steps 129 exceeds the context of 128"))
        let long = try decodeJob(Self.jobJSON.replacingOccurrences(of: "\"decode_tokens\": 4", with: "\"decode_tokens\": 127"))
        XCTAssertTrue(jobProblem(long)!.contains("need 129 KV positions"))
        let other = try decodeJob(Self.jobJSON.replacingOccurrences(of: "\"protocol_version\": 1", with: "\"protocol_version\": 2"))
        XCTAssertTrue(jobProblem(other)!.contains("protocol 2"))
    }

    func job(engine: String?, path: String, units: String? = nil) throws -> HarnessJob {
        var json = Self.jobJSON.replacingOccurrences(of: "models/ab/model.mlpackage", with: path)
        if let engine = engine { json = json.replacingOccurrences(of: "\"bytes_per_token\"", with: "\"engine\": \"\(engine)\", \"bytes_per_token\"") }
        if let units = units { json = json.replacingOccurrences(of: "\"bytes_per_token\"", with: "\"compute_units\": \"\(units)\", \"bytes_per_token\"") }
        return try decodeJob(json)
    }

    func testBothEnginesAreChosenByNameAndOthersRefusedByName() throws {
        XCTAssertNil(jobProblem(try job(engine: nil, path: "models/ab/model.mlpackage")))
        XCTAssertNil(jobProblem(try job(engine: "coreml", path: "models/ab/model.mlpackage")))
        XCTAssertNil(jobProblem(try job(engine: "coreai", path: "models/ab/model.aimodel", units: "neural_engine")))
        XCTAssertEqual(try EngineKind.named("coreai"), .coreai)
        XCTAssertTrue(jobProblem(try job(engine: "onnx", path: "models/ab/model.onnx"))!.contains("engine onnx"))
        XCTAssertTrue(jobProblem(try job(engine: "coreai", path: "models/ab/model.mlpackage"))!.contains(".aimodel"))
        XCTAssertTrue(jobProblem(try job(engine: "coreai", path: "models/ab/model.aimodel", units: "tpu"))!.contains("compute_units tpu"))
        XCTAssertTrue(jobProblem(try job(engine: "coreml", path: "models/ab/model.mlpackage", units: "gpu"))!.contains("Core AI preference"))
    }

    func testTheGreedyScanStopsAtANonFiniteLogit() throws {
        let values: [Float] = [0.5, 3.0, .infinity, 9.0]
        XCTAssertEqual(try GreedyScan(count: 2) { values[$0] }.checked(position: 0), 1)
        XCTAssertThrowsError(try GreedyScan(count: 4) { values[$0] }.checked(position: 3)) { error in
            XCTAssertTrue("\(error)".contains("logit 2 at position 3"))
        }
        XCTAssertThrowsError(try GreedyScan(count: 0) { values[$0] }.checked(position: 0))
    }

    struct Scripted: StepEngine {
        var steps: [(Int, Int)] = []
        mutating func reset() throws {}
        mutating func step(token: Int, position: Int) throws -> Int {
            steps.append((token, position))
            return token + 100
        }
    }

    final class Counting: SweepObserver {
        var steps = 0
        var prompts = 0
        var interruptAfter = Int.max
        func afterStep() throws {
            steps += 1
            if steps >= interruptAfter { throw HarnessError.interrupted("test") }
        }
        func afterPrompt(_ result: PromptResult) -> PromptResult {
            prompts += 1
            return result
        }
    }

    func testTheSweepStepsPrefillThenDecode() async throws {
        var engine = Scripted()
        let observer = Counting()
        let result = try await runPrompt(&engine, prompt: HarnessPrompt(index: 2, tokenIds: [1, 2, 3]), decodeTokens: 3, observer: observer)
        XCTAssertEqual(engine.steps.map { $0.1 }, [0, 1, 2, 3, 4])
        XCTAssertEqual(result.tokenIds, [103, 203, 303])
        XCTAssertEqual(result.tokenLatenciesMs.count, 3)
        XCTAssertEqual(observer.steps, 5)
        XCTAssertEqual(observer.prompts, 1)
        let keys = try JSONSerialization.jsonObject(with: JSONEncoder().encode(result)) as! [String: Any]
        XCTAssertNotNil(keys["token_latencies_ms"])
    }

    func testAnInterruptionStopsTheSweepWithItsReason() async throws {
        var engine = Scripted()
        let observer = Counting()
        observer.interruptAfter = 2
        do {
            _ = try await runPrompt(&engine, prompt: HarnessPrompt(index: 0, tokenIds: [1, 2, 3]), decodeTokens: 3, observer: observer)
            XCTFail("the sweep went on after the interruption")
        } catch {
            XCTAssertEqual((error as? HarnessError)?.reason, .interrupted)
        }
        XCTAssertEqual(engine.steps.count, 2)
    }

    func testArgmaxReadsFloat16AndFloat32AndRefusesNaN() throws {
        let half = try MLMultiArray(shape: [1, 1, 4], dataType: .float16)
        for (index, value) in [0.5, 2.0, -1.0, 1.0].enumerated() { half[index] = NSNumber(value: value) }
        XCTAssertEqual(try Argmax.of(half, position: 0), 1)
        let single = try MLMultiArray(shape: [1, 1, 3], dataType: .float32)
        for (index, value) in [0.5, -2.0, 3.0].enumerated() { single[index] = NSNumber(value: value) }
        XCTAssertEqual(try Argmax.of(single, position: 0), 2)
        single[1] = NSNumber(value: Float.nan)
        XCTAssertThrowsError(try Argmax.of(single, position: 5)) { error in
            XCTAssertTrue("\(error)".contains("logit 1 at position 5"))
        }
        let ints = try MLMultiArray(shape: [1, 1, 3], dataType: .int32)
        XCTAssertThrowsError(try Argmax.of(ints, position: 0))
    }

    func testNewKeysAndValuesAreWrittenAtTheirPosition() throws {
        let cache = try MLMultiArray(shape: [1, 2, 4, 3], dataType: .float16)
        for index in 0..<cache.count { cache[index] = 0 }
        let new = try MLMultiArray(shape: [1, 2, 1, 3], dataType: .float32)
        for index in 0..<6 { new[index] = NSNumber(value: Float(index + 1)) }
        try KVWriter.write(new, into: cache, at: 2, name: "key_0")
        XCTAssertEqual(cache[[0, 1, 2, 2] as [NSNumber]].floatValue, 6)
        XCTAssertEqual(cache[[0, 0, 2, 0] as [NSNumber]].floatValue, 1)
        XCTAssertEqual(cache[[0, 0, 1, 0] as [NSNumber]].floatValue, 0)
    }

    func testAFailedRunSaysWhyInItsDoneMarker() throws {
        let marker = DoneMarker(runId: 7, ok: false, resultsSha256: nil, error: "interrupted: locked", reason: .interrupted)
        let keys = try JSONSerialization.jsonObject(with: JSONEncoder().encode(marker)) as! [String: Any]
        XCTAssertEqual(keys["reason"] as? String, "interrupted")
        XCTAssertEqual(keys["protocol_version"] as? Int, HarnessProtocol.version)
    }
}
