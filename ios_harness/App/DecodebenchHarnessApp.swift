// The app: on launch, run the job in Documents (file sharing is on, so the agent pushes it
// over house_arrest), keep the screen awake while measuring, then show what happened.
import HarnessKit
import SwiftUI
import UIKit

@main
struct DecodebenchHarnessApp: App {
    @State private var status = "waiting for a job"

    var body: some Scene {
        WindowGroup {
            Text(status).font(.system(.body, design: .monospaced)).padding()
                .task { await runJob() }
        }
    }

    @MainActor
    private func runJob() async {
        let documents = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
        let arguments = CommandLine.arguments
        let jobFile = arguments.firstIndex(of: "--job").flatMap { index in
            index + 1 < arguments.count ? arguments[index + 1] : nil
        } ?? HarnessFiles.job
        guard FileManager.default.fileExists(atPath: documents.appendingPathComponent(jobFile).path) else { return }
        UIApplication.shared.isIdleTimerDisabled = true  // no auto-lock mid-measurement
        status = "running \(jobFile)"
        await Task.detached(priority: .userInitiated) { await Harness(documents: documents).run(jobFile: jobFile) }.value
        UIApplication.shared.isIdleTimerDisabled = false
        status = "finished \(jobFile)"
    }
}
